//! Builds the C half of test_child's `child-jumper` (`csrc/longjmp_host.c`): a SIGALRM
//! handler that leaves by `siglongjmp`, which Rust cannot write.

fn main() {
    // What an application with krabka-pprof's `ebpf-labels` adds to its build script: the
    // custom-labels symbols exported from its executable, where eBPF profilers find them
    // (the labels suite reads them back through the dynamic symbols).
    // Not for static musl executables, which have no dynamic symbols (nor a reader).
    if std::env::var_os("CARGO_FEATURE_EBPF_LABELS").is_some()
        && std::env::var("CARGO_CFG_TARGET_ENV").as_deref() != Ok("musl")
    {
        for symbol in ["custom_labels_current_set", "custom_labels_abi_version"] {
            println!("cargo::rustc-link-arg-tests=-Wl,--export-dynamic-symbol={symbol}");
            println!("cargo::rustc-link-arg-bins=-Wl,--export-dynamic-symbol={symbol}");
        }
    }
    println!("cargo::rerun-if-changed=csrc/longjmp_host.c");
    cc::Build::new()
        .file("csrc/longjmp_host.c")
        .warnings(true)
        .compile("krabka_longjmp_host");
}
