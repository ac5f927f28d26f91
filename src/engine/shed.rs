//! Load shedding for CHECK2 by priority (PROTOCOL.md §5, "Priorities and
//! shedding").
//!
//! Overload is measured per connection as its **backlog**: the request
//! bytes the server has received on the connection and not answered yet,
//! behind the frame being answered: in its read buffer, and in the
//! kernel's receive queue when a read filled the buffer (the connection
//! asks the kernel once after such a read, for the first CHECK2 that needs
//! it: the buffer holds 16 KiB, so without the kernel's part the 24 KiB
//! default for normal priority was never passed). When the server falls
//! behind, it reaches each connection less often and finds more waiting;
//! shedding
//! the cheap-to-lose checks of the frames in that backlog gets it back to
//! the rest sooner.
//!
//! Invariants: low priority is shed at every backlog at which normal is
//! (the settings refuse `normal < low`); high priority is never shed; every
//! shed check is counted under its priority.

use prometheus::{IntCounter, IntCounterVec, Opts, Registry};
use tollgate_protocol::Priority;

/// When to shed, and the counters of what was shed.
#[derive(Debug, Clone)]
pub(crate) struct Shedder {
    /// Shed low priority above this backlog (bytes).
    low: usize,
    /// Shed normal priority above this backlog (bytes), `>= low`.
    normal: usize,
    /// `tollgate_checks_shed_total{priority}`, by wire value.
    shed: [IntCounter; 3],
}

impl Shedder {
    pub fn new(low: usize, normal: usize, registry: &Registry) -> prometheus::Result<Self> {
        let vec = IntCounterVec::new(
            Opts::new(
                "tollgate_checks_shed_total",
                "CHECK2 checks shed (answered Shed, nothing charged) because \
                 their connection's backlog was over the bound of their priority.",
            ),
            &["priority"],
        )?;
        registry.register(Box::new(vec.clone()))?;
        let shed = Priority::ALL.map(|p| vec.with_label_values(&[p.name()]));
        Ok(Self { low, normal, shed })
    }

    /// Whether a check of `priority` is shed at `backlog` bytes (not
    /// counted: a frame asks before its checks, to skip fetching the keys
    /// of those it will shed, and again for each; [`Shedder::count`]
    /// counts one shed).
    pub fn over(&self, priority: Priority, backlog: usize) -> bool {
        match priority {
            Priority::Low => backlog > self.low,
            Priority::Normal => backlog > self.normal,
            Priority::High => false,
        }
    }

    /// Counts one check of `priority` shed.
    pub fn count(&self, priority: Priority) {
        self.shed[priority as usize].inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn low_goes_first_and_high_never() {
        let s = Shedder::new(100, 1000, &Registry::new()).expect("metrics");
        let shed = |p, backlog| {
            let over = s.over(p, backlog);
            if over {
                s.count(p);
            }
            over
        };
        assert!(!shed(Priority::Low, 100));
        assert!(shed(Priority::Low, 101));
        assert!(!shed(Priority::Normal, 101));
        assert!(shed(Priority::Normal, 1001));
        assert!(!shed(Priority::High, usize::MAX));
        assert_eq!(s.shed.each_ref().map(IntCounter::get), [1, 1, 0]);
    }
}
