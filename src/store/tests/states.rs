//! What a key holds: one token bucket, one state of another algorithm.

use super::*;
use tollgate_protocol::LimitRef;

#[test]
fn a_group_with_two_other_algorithms_on_one_key_is_refused() {
    // A key holds one token bucket and one state of another algorithm: a
    // group charging a fixed and a sliding window on the same key would
    // keep only the second state, losing the first charge while answering
    // "allowed". It is refused whole instead, charging nothing.
    let s = store();
    let group = [fw("{k}x", 5, 1000, 1), sw("{k}x", 5, 1000, 1)];
    for mode in [Mode::Charge, Mode::Peek] {
        assert_eq!(
            s.check(&group, S, mode),
            CheckResult::Error(ErrorCode::InvalidLimit)
        );
    }
    assert_eq!(
        s.refund(&group, S),
        CheckResult::Error(ErrorCode::InvalidLimit)
    );
    assert!(s.is_empty());
    // Every pair of distinct non-token-bucket algorithms clashes.
    let others = [
        sw("{k}x", 5, 1000, 1),
        fw("{k}x", 5, 1000, 1),
        log("{k}x", 5, 1000, 1),
        pair("{k}x", Algorithm::LeakyBucket, 5, 1000, 5, 1),
        cc("{k}x", 5, 1000, 1),
    ];
    for (i, a) in others.iter().enumerate() {
        for b in &others[i + 1..] {
            let group = [a.clone(), tb("{k}y", 5, 1000, 5, 1), b.clone()];
            assert_eq!(
                s.check(&group, S, Mode::Charge),
                CheckResult::Error(ErrorCode::InvalidLimit),
                "{:?} and {:?}",
                a.limit,
                b.limit
            );
        }
    }
    assert!(s.is_empty());
    // A token bucket beside any other algorithm on one key is fine: both
    // states are kept and both are charged.
    for other in &others {
        let s = store();
        let group = [tb("{k}x", 5, 1000, 5, 1), other.clone()];
        assert!(decided(s.check(&group, S, Mode::Charge)).allowed);
        let held: Vec<_> = s
            .entries(b"{k}x", S)
            .iter()
            .map(|e| e.state.algorithm())
            .collect();
        let LimitRef::Inline(limit) = &other.limit else {
            unreachable!("inline limits only")
        };
        assert_eq!(held, [Algorithm::TokenBucket, limit.algorithm]);
    }
    // The same algorithm twice on one key shares its state (each pair sees
    // the charge of the one before).
    let twice = [fw("{k}x", 2, 1000, 1), fw("{k}x", 2, 1000, 1)];
    assert!(decided(s.check(&twice, S, Mode::Charge)).allowed);
    assert!(!decided(s.check(&twice[..1], S, Mode::Charge)).allowed);
}
