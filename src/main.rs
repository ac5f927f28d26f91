//! The `tollgate` binary: see [`tollgate::cli`].
#![deny(unsafe_code)]

/// mimalloc, whose arenas take transparent huge pages: the store's tables
/// then miss the TLB far less (`--huge-pages`, src/huge_pages.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
