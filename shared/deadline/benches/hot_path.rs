//! The deadline's share of every request: each hop parses the incoming `grpc-timeout`, formats
//! the one it forwards, and encodes its ledger entry into the answer; the gateway parses the
//! chain's ledger to render `Server-Timing`. `cargo bench -p deadline` runs them.

use std::{hint::black_box, time::Duration};

use criterion::{Criterion, criterion_group, criterion_main};
use deadline::{Deadline, Hop, HopStats, grpc_timeout, ledger};
use tokio::time::Instant;

/// The ledger of an order through the four hops, as the gateway receives it.
const FOUR_HOPS: &str = "gateway;received=2000;spent=0.2;reserved=20;forwarded=1979.8;left=1974.7, \
    orders;received=1979.8;spent=1.4;reserved=200;forwarded=1778.4;left=1955.3, \
    payment;received=1778.4;spent=0.1;reserved=300;forwarded=1478.3;left=1756.7, \
    bank-mock;received=1478.3;spent=21.3;reserved=0;forwarded=0;left=1457";

fn grpc_timeout_header(c: &mut Criterion) {
    let mut group = c.benchmark_group("grpc-timeout");
    group.bench_function("parse 1478300u", |b| {
        b.iter(|| grpc_timeout::parse(black_box("1478300u")))
    });
    group.bench_function("parse 2S", |b| {
        b.iter(|| grpc_timeout::parse(black_box("2S")))
    });
    group.bench_function("format 1478.3 ms", |b| {
        b.iter(|| grpc_timeout::format(black_box(Duration::from_micros(1_478_300))))
    });
    group.finish();
}

fn ledger_encoding(c: &mut Criterion) {
    let mut group = c.benchmark_group("ledger");
    let hop = Hop::new(
        "payment",
        Deadline::after(Instant::now(), Duration::from_millis(1_778)),
        HopStats::new(),
    );
    group.bench_function("encode one hop's entry", |b| {
        b.iter(|| hop.ledger_at(black_box(Instant::now())))
    });
    group.bench_function("parse four hops", |b| {
        b.iter(|| ledger::parse(black_box(FOUR_HOPS)))
    });
    let entries = ledger::parse(FOUR_HOPS).expect("a valid ledger");
    group.bench_function("Server-Timing of four hops", |b| {
        b.iter(|| ledger::server_timing(black_box(&entries)))
    });
    group.finish();
}

criterion_group!(benches, grpc_timeout_header, ledger_encoding);
criterion_main!(benches);
