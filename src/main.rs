//! `estc`, the command-line driver.

mod cli;

/// Running out of memory is E0602 and status 1, not an abort (see `est::oom`).
#[global_allocator]
static ALLOCATOR: est::oom::Guard = est::oom::Guard;

fn main() {
    // Like other Unix tools, end quietly when the reader of our output goes away
    // (`estc explain E0801 | head`) instead of failing to print.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE at start-up, before any
    // thread exists, is what a C program's runtime does.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    est::runtime::keep_freed_memory();
    // (arguments that are not UTF-8 are clap's to report)
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let json = args
        .windows(2)
        .any(|w| w[0] == "--message-format" && w[1] == "json")
        || args.iter().any(|a| a == "--message-format=json");
    est::oom::report_as_json(json);
    std::process::exit(cli::main());
}
