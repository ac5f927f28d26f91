//! Transparent huge pages for the heap (`--huge-pages on|off`, default
//! off: they trade resident memory for speed, so an operator opts in).
//!
//! The binary's global allocator is mimalloc (src/main.rs). A check's cost
//! at a million keys and more is dominated by two cache and TLB misses in
//! the store's hash tables (the control group, then the entry's key), and
//! with 4 KiB pages nearly every one of them also misses the TLB: 1024
//! stripes of tables spread over tens of MiB. Backing the heap with 2 MiB
//! pages takes most TLB misses away. Since a frame's keys are prefetched
//! before they are checked (`store/tables/hint.rs`), those misses overlap
//! and huge pages measured no faster (docs/BENCHMARKS.md); the option stays
//! for hosts where TLB misses cost more.
//!
//! mimalloc (v3, bundled by `libmimalloc-sys`) already asks for huge pages
//! with `madvise(MADV_HUGEPAGE)` on the arenas it maps, so on a host whose
//! THP mode is `madvise` or `always` the heap gets them. What it does not
//! do by default is keep them: it gives freed memory back in pieces as
//! small as one 64 KiB arena slice, which splits a huge page (measured at
//! 1M keys under key churn: 47 MiB of the heap on huge pages, against 96
//! MiB with the option below). [`Held::apply`] with [`HugePages::On`] sets
//! mimalloc's `allow_thp` option to 2, which purges only whole 2 MiB
//! ranges.
//!
//! [`HugePages::Off`] keeps the whole process out of THP with
//! `prctl(PR_SET_THP_DISABLE)`, checked by the kernel at every page fault:
//! it holds for the arena mimalloc advised before the flag was read, and
//! under the host mode `always` too. mimalloc's `allow_thp` goes to 0 so it
//! stops advising and purges at 4 KiB again, and its `purge_delay` goes
//! from 1000 ms to 0: freed memory goes back to the OS when it is freed,
//! as glibc unmaps a large block at once. Otherwise the half-size tables
//! each stripe's doubling leaves behind stay resident for a second, and
//! after that until some page is freed (an idle server frees none):
//! measured at 1M token-bucket keys, 78 bytes per key resident straight
//! after the fill, 57.5 once purged, 55.7 with the delay at 0 (glibc
//! 57.7). [`hold`] sets the prctl flag before the flags are parsed and
//! [`Held::apply`] lifts it for `on`, so what start-up allocates stays on
//! small pages either way.
//!
//! [`host_mode`] reads the host's THP mode, for the start-up log and for
//! the operator: with `never` neither setting changes anything.

use serde::Serialize;

/// `--huge-pages`: whether the server's heap uses transparent huge pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum HugePages {
    On,
    Off,
}

impl HugePages {
    /// The flag's value, as written on the command line.
    pub fn name(self) -> &'static str {
        match self {
            HugePages::On => "on",
            HugePages::Off => "off",
        }
    }
}

/// The host's THP mode, `/sys/kernel/mm/transparent_hugepage/enabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMode {
    /// Every anonymous mapping may get huge pages.
    Always,
    /// Only mappings advised with `MADV_HUGEPAGE` (what mimalloc does).
    Madvise,
    /// None: `--huge-pages` changes nothing.
    Never,
}

impl HostMode {
    pub fn name(self) -> &'static str {
        match self {
            HostMode::Always => "always",
            HostMode::Madvise => "madvise",
            HostMode::Never => "never",
        }
    }

    /// The selected mode of the sysfs file's text, e.g.
    /// `always [madvise] never`.
    pub fn parse(text: &str) -> Option<HostMode> {
        let selected = text.split_whitespace().find(|w| w.starts_with('['))?;
        match selected.trim_matches(|c| c == '[' || c == ']') {
            "always" => Some(HostMode::Always),
            "madvise" => Some(HostMode::Madvise),
            "never" => Some(HostMode::Never),
            _ => None,
        }
    }
}

/// The host's THP mode; None when the kernel has no THP (or no sysfs).
pub fn host_mode() -> Option<HostMode> {
    let text = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").ok()?;
    HostMode::parse(&text)
}

/// What [`Held::apply`] found and did, for the start-up log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    pub mode: HugePages,
    pub host: Option<HostMode>,
    /// The process is opted out of THP: by `off`, or (with `on`) by its
    /// parent, since the flag is inherited across fork and exec.
    pub process_disabled: bool,
}

impl Applied {
    /// Whether the heap can get huge pages: asked for, allowed by the host,
    /// and not disabled for the process.
    pub fn effective(&self) -> bool {
        self.mode == HugePages::On
            && !self.process_disabled
            && matches!(self.host, Some(HostMode::Madvise | HostMode::Always))
    }
}

/// The process held off THP while its flags are read: [`hold`], then
/// [`Held::apply`].
#[derive(Debug)]
pub struct Held {
    /// The parent had opted the process out already (the flag is inherited
    /// across fork and exec): `on` leaves it so.
    inherited: bool,
}

/// First thing in `main`: opts the process out of THP until
/// [`Held::apply`] decides. Parsing the flags allocates; in mimalloc's
/// advised arena that memory would otherwise be faulted in on huge pages,
/// which `off` could not take back (measured: `off` then kept 6 MiB on
/// huge pages, with this 4 MiB, faulted in before `main`).
pub fn hold() -> std::io::Result<Held> {
    let inherited = process_thp_disabled()?;
    set_process_thp_disabled(true)?;
    Ok(Held { inherited })
}

impl Held {
    /// Sets the heap's huge-page policy. Call it before other threads run
    /// and before the store allocates its tables.
    pub fn apply(self, mode: HugePages) -> std::io::Result<Applied> {
        let process_disabled = match mode {
            HugePages::On => {
                set_mimalloc_option(MI_OPTION_ALLOW_THP, 2);
                if !self.inherited {
                    set_process_thp_disabled(false)?;
                }
                self.inherited
            }
            HugePages::Off => {
                set_mimalloc_option(MI_OPTION_ALLOW_THP, 0);
                set_mimalloc_option(MI_OPTION_PURGE_DELAY, 0);
                true
            }
        };
        Ok(Applied {
            mode,
            host: host_mode(),
            process_disabled,
        })
    }
}

/// `prctl(PR_GET_THP_DISABLE)`.
#[cfg(target_os = "linux")]
fn process_thp_disabled() -> std::io::Result<bool> {
    Ok(rustix::thread::transparent_huge_pages_are_disabled()?)
}

/// `prctl(PR_SET_THP_DISABLE)`: a flag of the whole process (its memory
/// map), which the kernel checks at each fault and khugepaged honours.
#[cfg(target_os = "linux")]
fn set_process_thp_disabled(disabled: bool) -> std::io::Result<()> {
    Ok(rustix::thread::disable_transparent_huge_pages(disabled)?)
}

/// Elsewhere there is no THP to opt out of.
#[cfg(not(target_os = "linux"))]
fn process_thp_disabled() -> std::io::Result<bool> {
    Ok(false)
}

#[cfg(not(target_os = "linux"))]
fn set_process_thp_disabled(_: bool) -> std::io::Result<()> {
    Ok(())
}

/// mimalloc's `mi_option_allow_thp` (include/mimalloc.h of the bundled v3):
/// 0 no THP, 1 advise arenas with `MADV_HUGEPAGE` (the default), 2 that and
/// purge only whole huge pages. `libmimalloc-sys` names no constant for it.
const MI_OPTION_ALLOW_THP: libmimalloc_sys::mi_option_t = 43;

/// mimalloc's `mi_option_purge_delay`: milliseconds between freeing memory
/// and giving it back to the OS (1000 in the bundled v3, 0 at once, -1
/// never). Not named by `libmimalloc-sys` either.
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

// The options' numbers are their places in mimalloc's option enum: a
// bundled mimalloc with another option table must be looked at again.
const _: () = assert!(
    libmimalloc_sys::_mi_option_last == 47,
    "mimalloc's option table changed: check MI_OPTION_ALLOW_THP and MI_OPTION_PURGE_DELAY"
);

/// The crate's one FFI call: sets one of mimalloc's options.
#[allow(unsafe_code)]
fn set_mimalloc_option(option: libmimalloc_sys::mi_option_t, value: std::os::raw::c_long) {
    // SAFETY: `mi_option_set` stores `value` into one entry of mimalloc's
    // static option table; it takes any option number below
    // `_mi_option_last` (asserted above for the two used) and any value for
    // them, which mimalloc reads when it maps or purges memory. It is not
    // synchronised: `Held::apply` runs before the process starts other
    // threads (the server's runtime, the bench's stores), so nothing reads
    // the entry concurrently.
    unsafe { libmimalloc_sys::mi_option_set(option, value) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_selected_host_mode() {
        assert_eq!(
            HostMode::parse("always [madvise] never\n"),
            Some(HostMode::Madvise)
        );
        assert_eq!(
            HostMode::parse("[always] madvise never"),
            Some(HostMode::Always)
        );
        assert_eq!(
            HostMode::parse("always madvise [never]"),
            Some(HostMode::Never)
        );
        assert_eq!(HostMode::parse("always madvise never"), None);
        assert_eq!(HostMode::parse(""), None);
    }

    #[test]
    fn effective_only_when_asked_allowed_and_not_disabled() {
        let on = |host, process_disabled| Applied {
            mode: HugePages::On,
            host,
            process_disabled,
        };
        assert!(on(Some(HostMode::Madvise), false).effective());
        assert!(on(Some(HostMode::Always), false).effective());
        assert!(!on(Some(HostMode::Never), false).effective());
        assert!(!on(None, false).effective());
        assert!(!on(Some(HostMode::Madvise), true).effective());
        let off = Applied {
            mode: HugePages::Off,
            host: Some(HostMode::Always),
            process_disabled: true,
        };
        assert!(!off.effective());
    }
}
