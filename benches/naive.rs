//! Benchmark for lab naive (being written).

fn main() {
    println!("not written yet");
}
