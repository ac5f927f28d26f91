//! Codec micro-benchmarks: encode and decode one CHECK frame of 64 checks
//! (inline limits, and naming a rule), and the matching CHECKED answer.
//! `cargo bench --bench codec`.

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;
use tollgate_protocol::{
    decode_request, decode_response, encode_checked, encode_request, Algorithm, CheckBatch,
    CheckResult, Decision, Limit, Pair, Request, RuleName, ServerLimits,
};

const BATCH: usize = 64;

fn batch() -> CheckBatch {
    let mut b = CheckBatch::with_capacity(BATCH);
    for i in 0..BATCH {
        b.push(Pair {
            key: Bytes::from(format!("rl:{{user{i:08}}}:s")),
            limit: Limit {
                algorithm: Algorithm::TokenBucket,
                count: 100,
                period_ms: 1000,
                burst: 200,
            }
            .into(),
            cost: 1,
        });
    }
    b
}

fn codec(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec_batch_64");
    group.throughput(Throughput::Elements(BATCH as u64));
    let request = Request::Check(batch());
    let limits = ServerLimits::default();
    let mut wire = BytesMut::new();
    encode_request(7, &request, &mut wire).unwrap();
    let frame = wire.freeze();

    group.bench_function("encode_check", |b| {
        let mut dst = BytesMut::with_capacity(frame.len());
        b.iter(|| {
            dst.clear();
            encode_request(7, black_box(&request), &mut dst).unwrap();
        })
    });
    group.bench_function("decode_check", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(&frame[..]);
            black_box(decode_request(&mut src, &limits).unwrap().unwrap());
        })
    });
    // The same checks naming a rule: the decoded pair holds its name.
    let mut named = CheckBatch::with_capacity(BATCH);
    for pair in batch().iter().flatten() {
        named.push(Pair::rule(
            pair.key.clone(),
            RuleName::from_static("per-tenant"),
            1,
        ));
    }
    let mut wire = BytesMut::new();
    encode_request(7, &Request::Check(named), &mut wire).unwrap();
    let named = wire.freeze();
    group.bench_function("decode_check_rule", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(&named[..]);
            black_box(decode_request(&mut src, &limits).unwrap().unwrap());
        })
    });

    let decision = CheckResult::Decision(Decision {
        allowed: true,
        shadow_denied: false,
        pair: 0,
        limit: 200,
        remaining: 150,
        reset_after_ms: 500,
        retry_after_ms: 0,
        lease: None,
    });
    let mut answer = BytesMut::new();
    encode_checked(7, std::iter::repeat_n(decision, BATCH), &mut answer).unwrap();
    let answer = answer.freeze();
    group.bench_function("encode_checked", |b| {
        let mut dst = BytesMut::with_capacity(answer.len());
        b.iter(|| {
            dst.clear();
            encode_checked(7, std::iter::repeat_n(black_box(decision), BATCH), &mut dst).unwrap();
        })
    });
    group.bench_function("decode_checked", |b| {
        b.iter(|| {
            let mut src = BytesMut::from(&answer[..]);
            black_box(decode_response(&mut src, 1 << 22).unwrap().unwrap());
        })
    });
    group.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
