//! Benchmark for lab skip_locked (being written).

fn main() {
    println!("not written yet");
}
