//! Builds the C half of test_child's `child-jumper` (`csrc/longjmp_host.c`): a SIGALRM
//! handler that leaves by `siglongjmp`, which Rust cannot write.

fn main() {
    println!("cargo::rerun-if-changed=csrc/longjmp_host.c");
    cc::Build::new()
        .file("csrc/longjmp_host.c")
        .warnings(true)
        .compile("krabka_longjmp_host");
}
