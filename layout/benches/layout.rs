//! Criterion benches for dmem-layout hot paths (filled in by the layout work).
use criterion::{Criterion, criterion_group, criterion_main};

fn placeholder(_c: &mut Criterion) {}

criterion_group!(benches, placeholder);
criterion_main!(benches);
