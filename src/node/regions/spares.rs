//! Emptied journals kept for the next interval's usage.
//!
//! Every interval the shared journal is replaced, each peer but the last
//! gets a copy of its share, and each sender's emptied pending journal is
//! swapped out for the new usage (journal.rs). Those tables hold one
//! interval's keys (135,000 entries, some 18 MiB, at 270,000 global checks
//! a second and the default half-second interval). Freed, the allocator
//! hands their pages back to the OS at once (`huge_pages.rs`: mimalloc's
//! purge delay is 0), so each new table took a page fault on every page
//! as the check path wrote its first entries, and grew (moving every
//! entry) whenever one interval's keys outnumbered the last's: 8% of the
//! server's CPU under a global rule, in perf. Kept here, emptied, the
//! tables are written again where they already are.
//!
//! At most one spare per peer and one more is kept (what one interval
//! frees). A kept table is empty: no journal's bytes count it. Each is at
//! most the table of a journal at its largest (bounded by
//! `region-journal-max-bytes`); one over four times what the recent
//! intervals asked for (left by a backlog) is shrunk when taken, so after
//! an outage the spares come back to the size of the traffic.
//!
//! "Recent" is a peak that fades by an eighth each interval
//! ([`Spares::fade`]), not the last ask alone: intervals are uneven (the
//! first sender to tick shares out, and a sender draining a backlog ticks
//! late), and under a global rule at 1M keys their keys went 50,000,
//! 200,000, 70,000, 220,000. Shrunk to each small one, the table grew
//! twice in the next, on the check path, each time into new pages.

use super::journal::Journal;
use crate::sync::Mutex;

/// Room kept beyond the last interval's count, so an interval a little
/// busier than the last does not grow its table.
const HEADROOM_DIVISOR: usize = 4;

/// A spare with room for more than this many times the recent peak of
/// what was asked is shrunk to that peak.
const SHRINK_OVER: usize = 4;

/// The recent peak loses this fraction of itself each interval.
const PEAK_DECAY_DIVISOR: usize = 8;

#[derive(Debug)]
pub(super) struct Spares {
    kept: Mutex<Kept>,
    /// At most this many kept.
    max: usize,
}

#[derive(Debug, Default)]
struct Kept {
    /// Roomiest last.
    journals: Vec<Journal>,
    /// The largest room asked for recently (see the module's header).
    peak: usize,
}

impl Spares {
    /// Keeps at most `max` journals.
    pub fn new(max: usize) -> Self {
        Self {
            kept: Mutex::new(Kept {
                journals: Vec::with_capacity(max),
                peak: 0,
            }),
            max,
        }
    }

    /// An empty journal with room for `entries` entries and a quarter more:
    /// a spare if one is kept (the roomiest), else a new one.
    pub fn take(&self, entries: usize) -> Journal {
        let want = entries.saturating_add(entries / HEADROOM_DIVISOR);
        let (spare, peak) = {
            let mut kept = self.kept.lock();
            kept.peak = kept.peak.max(want);
            (kept.journals.pop(), kept.peak)
        };
        match spare {
            Some(mut journal) => {
                if journal.capacity() / SHRINK_OVER > peak {
                    journal.shrink_to(peak);
                }
                journal.reserve(want);
                journal
            }
            None => Journal::with_capacity(want),
        }
    }

    /// Lets the recent peak fade by an eighth: once an interval, before
    /// its tables are taken (once per take, it would fade faster the more
    /// peers take a share).
    pub fn fade(&self) {
        let mut kept = self.kept.lock();
        kept.peak -= kept.peak / PEAK_DECAY_DIVISOR;
    }

    /// Keeps `journal`, emptied, unless it has no table or enough are kept.
    pub fn give_back(&self, mut journal: Journal) {
        if journal.capacity() == 0 {
            return;
        }
        journal.clear();
        let mut kept = self.kept.lock();
        let kept = &mut kept.journals;
        if kept.len() >= self.max {
            // Full: the newcomer replaces the smallest kept if roomier.
            if kept
                .first()
                .is_some_and(|j| j.capacity() < journal.capacity())
            {
                kept.remove(0);
            } else {
                return;
            }
        }
        // Roomiest last, where `take` pops.
        let at = kept.partition_point(|j| j.capacity() <= journal.capacity());
        kept.insert(at, journal);
    }

    /// How many are kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.kept.lock().journals.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_journal_given_back_is_taken_again_with_its_room() {
        let spares = Spares::new(2);
        let big = Journal::with_capacity(1000);
        let room = big.capacity();
        spares.give_back(Journal::with_capacity(10));
        spares.give_back(big);
        // A third is not kept (no roomier than the smallest), nor one
        // without a table.
        spares.give_back(Journal::with_capacity(10));
        spares.give_back(Journal::default());
        assert_eq!(spares.len(), 2);
        let taken = spares.take(500);
        assert_eq!(taken.capacity(), room, "the roomiest, not grown");
        assert!(taken.is_empty());
        // The small one is grown to what is asked, and a quarter more.
        assert!(spares.take(100).capacity() >= 125);
        assert_eq!(spares.len(), 0);
        assert!(spares.take(100).capacity() >= 125);
    }

    #[test]
    fn uneven_intervals_keep_the_room_of_the_busy_ones_until_it_fades() {
        let spares = Spares::new(1);
        spares.give_back(spares.take(200_000));
        let busy = spares.kept.lock().journals[0].capacity();
        // A quiet interval between busy ones: the table keeps its room
        // (shrunk to it, the next busy interval would grow it again).
        for _ in 0..3 {
            spares.fade();
            let quiet = spares.take(40_000);
            assert_eq!(quiet.capacity(), busy);
            spares.give_back(quiet);
            spares.fade();
            let again = spares.take(200_000);
            assert_eq!(again.capacity(), busy);
            spares.give_back(again);
        }
        // Quiet for good: the peak fades and the table comes back to the
        // traffic's size.
        for _ in 0..40 {
            spares.fade();
            spares.give_back(spares.take(1_000));
        }
        let faded = spares.kept.lock().journals[0].capacity();
        assert!(faded < 10_000, "{faded}");
    }

    #[test]
    fn a_full_pool_keeps_the_roomier_and_a_spare_far_too_big_shrinks() {
        let spares = Spares::new(1);
        spares.give_back(Journal::with_capacity(10));
        spares.give_back(Journal::with_capacity(100_000));
        let kept = spares.kept.lock().journals[0].capacity();
        assert!(kept >= 100_000, "the roomier was kept: {kept}");
        // Taken for an interval of 100 keys, it comes back to their size.
        let small = spares.take(100);
        assert!(
            (125..1000).contains(&small.capacity()),
            "{}",
            small.capacity()
        );
    }
}
