//! The Postgres advisory lock (being written for lab 4).
