//! The etcd lock (being written for lab 4).
