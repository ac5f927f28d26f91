//! Tests of what the algorithms share: policy validation, the size of a
//! key's state, which algorithms can be global, refunds and leases.

use super::*;

#[test]
fn state_stays_small() {
    // The store keeps one State per key: adding an algorithm must not
    // grow every key.
    assert!(std::mem::size_of::<State>() <= 32);
}

fn limit(algorithm: Algorithm, count: u64, period_ms: u64, burst: u64) -> Limit {
    Limit {
        algorithm,
        count,
        period_ms,
        burst,
    }
}

#[test]
fn every_algorithm_validates_its_burst() {
    use Algorithm::*;
    for a in [SlidingWindow, FixedWindow, SlidingLog, Concurrency] {
        assert_eq!(
            Policy::from_limit(&limit(a, 10, 1000, 1)),
            Err(InvalidLimit::UnexpectedBurst {
                algorithm: a.name(),
                burst: 1
            })
        );
        assert!(Policy::from_limit(&limit(a, 10, 1000, 0)).is_ok());
    }
    for a in [TokenBucket, LeakyBucket] {
        assert_eq!(
            Policy::from_limit(&limit(a, 10, 1000, 0)),
            Err(InvalidLimit::Burst(0))
        );
        assert!(Policy::from_limit(&limit(a, 10, 1000, 1)).is_ok());
    }
}

#[test]
fn logs_and_leases_are_capped() {
    let at_cap = limit(Algorithm::SlidingLog, 1000, 1000, 0);
    assert!(Policy::from_limit(&at_cap).is_ok());
    let over = limit(Algorithm::SlidingLog, 1001, 1000, 0);
    let err = Policy::from_limit(&over).unwrap_err();
    assert_eq!(
        err,
        InvalidLimit::LogTooLong {
            count: 1001,
            max: 1000
        }
    );
    assert!(err.to_string().contains("use sliding-window"), "{err}");
    assert!(Policy::from_limit_with(&over, 2000).is_ok());
    let leases = limit(Algorithm::Concurrency, 11, 1000, 0);
    assert_eq!(
        Policy::from_limit_with(&leases, 10),
        Err(InvalidLimit::TooManyInFlight { count: 11, max: 10 })
    );
}

#[test]
fn only_buckets_and_windows_absorb_usage_made_elsewhere() {
    for a in Algorithm::ALL {
        let burst = if matches!(a, Algorithm::TokenBucket | Algorithm::LeakyBucket) {
            1
        } else {
            0
        };
        let p = Policy::from_limit(&limit(a, 10, 1000, burst)).unwrap();
        let absorbed = p.absorb(None, 5, 10, 1);
        assert_eq!(absorbed.is_ok(), why_not_global(a).is_none(), "{a:?}");
        if let Err(e) = absorbed {
            assert!(e.to_string().contains("cannot be global"), "{e}");
        }
    }
    // A sender ahead of this clock: its usage counts as now.
    let tb = Policy::from_limit(&limit(Algorithm::TokenBucket, 1, 1000, 5)).unwrap();
    let now = 10 * crate::clock::NANOS_PER_MS * 1000;
    let (state, _) = tb.absorb(None, now * 2, now, 1).unwrap().unwrap();
    assert_eq!(
        state,
        State::TokenBucket {
            tat: now + 1000 * crate::clock::NANOS_PER_MS
        }
    );
    assert_eq!(tb.absorb(None, now, now, 0), Ok(None));
}

#[test]
fn concurrency_cannot_be_refunded() {
    let p = Policy::from_limit(&limit(Algorithm::Concurrency, 2, 1000, 0)).unwrap();
    assert_eq!(p.refund(None, 0, 1), Err(InvalidLimit::RefundOfLeases));
}

#[test]
fn a_lease_is_only_on_the_wire_when_allowed() {
    let d = Decision {
        allowed: false,
        limit: 1,
        remaining: 0,
        reset_after: 1,
        retry_after: Some(1),
        lease: Some(7),
    };
    assert_eq!(d.to_wire(0).lease, None);
    let d = Decision { allowed: true, ..d };
    assert_eq!(d.to_wire(0).lease, Some(7));
}
