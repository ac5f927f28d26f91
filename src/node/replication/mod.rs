//! Replication: a primary streams its state to a standby, epochs fence a
//! replaced primary. Wire format: `PROTOCOL.md` §13; guarantees: the
//! docs/REPLICATION.md.
//!
//! ```text
//!            primary                                      standby
//!  check -> stripe lock -> write + ChangeLog       follower (standby.rs):
//!  feed (primary.rs): every --repl-flush            apply under
//!    drain stripes -> frames -> backlog  ==REPL_CHANGES/SNAPSHOT==>  stripe locks
//!                                        <==REPL_ACK========
//!  every --heartbeat: REPL_HEARTBEAT  ======================>  heard(): the role
//!                                                               source may fail over
//! ```
//!
//! - [`primary`]: the feed (drains, frames, the attached standby);
//! - `backlog`: recent frames, for a standby that resumes;
//! - [`standby`]: the follower;
//! - [`handoff`]: a stepped-down primary's states, merged into the primary
//!   it then follows (and a moving slot's, into its new shard);
//! - [`records`]: store states <-> records.
//!
//! Which side runs is the role's business (the supervisor starts the feed
//! on a primary and the follower on a standby); neither decides a role.

mod backlog;
pub(crate) mod handoff;
pub(crate) mod primary;
pub(crate) mod records;
pub(crate) mod standby;
