//! Simulator speed (filled in below).
#![allow(missing_docs)] // criterion_group! generates undocumented public functions
use criterion::{Criterion, criterion_group, criterion_main};
fn benches(_c: &mut Criterion) {}
criterion_group!(group, benches);
criterion_main!(group);
