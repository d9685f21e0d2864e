//! Benchmark for lab etcd_vs_redis (being written).

fn main() {
    println!("not written yet");
}
