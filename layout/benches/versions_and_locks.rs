//! Criterion benches: CQL outcome decode, CVT version pick, cacheline-version check.
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
use criterion::{Criterion, criterion_group, criterion_main};

fn benches(_c: &mut Criterion) {}

criterion_group!(group, benches);
criterion_main!(group);
