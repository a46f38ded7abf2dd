//! Declares the `loom` cfg so `RUSTFLAGS="--cfg loom"` model-checks the crate without warnings.
fn main() {
    println!("cargo::rustc-check-cfg=cfg(loom)");
}
