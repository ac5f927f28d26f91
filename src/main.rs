//! The `tollgate` binary: see [`tollgate::cli`].
#![deny(unsafe_code)]

/// mimalloc: with `--huge-pages on` its arenas take transparent huge pages
/// and the store's tables miss the TLB far less; with `off` (the default)
/// it gives freed memory back at once (src/huge_pages.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
