//! The `tollgate` binary: see [`tollgate::cli`].

fn main() -> std::process::ExitCode {
    tollgate::cli::main()
}
