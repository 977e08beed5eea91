//! One mistake per file under `ui/fail/`, each with a reviewed `.stderr`; the accepted
//! shapes under `ui/pass/`. Regenerate with `TRYBUILD=overwrite` and review the diff.

#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.pass("tests/ui/pass/*.rs");
    cases.compile_fail("tests/ui/fail/*.rs");
}
