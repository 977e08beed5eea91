//! What symbolization names: [`FunctionLine`], one function of a frame with the file and
//! line the frame stands for in it (a line of pprof's `Location`), the same whether the
//! symbol table or DWARF named it; and how a mangled name reads.

/// One function of a frame: one line of its location.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct FunctionLine {
    /// Demangled, as people read it; empty where nothing names the function.
    pub(crate) name: String,
    /// As in the symbol table (or DWARF's linkage name).
    pub(crate) system_name: String,
    /// Empty when unknown; absolute where the compilation recorded its directory.
    pub(crate) filename: String,
    /// 0 when unknown (or for code the compiler made up, which DWARF gives line 0).
    pub(crate) line: i64,
    /// The function's first line in `filename`; 0 when unknown.
    pub(crate) start_line: i64,
}

impl FunctionLine {
    /// A function known by name alone (a symbol, or a marker), without a file or line.
    pub(crate) fn named(name: String, system_name: String) -> FunctionLine {
        FunctionLine {
            name,
            system_name,
            ..FunctionLine::default()
        }
    }
}

/// Rust names (legacy and v0 mangling) without the hash; anything else as it is.
pub(crate) fn demangle(raw: &str) -> String {
    match rustc_demangle::try_demangle(raw) {
        Ok(demangled) => format!("{demangled:#}"),
        Err(_) => raw.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A function known by its symbol alone keeps the symbol as written (pprof's
    /// `system_name`) beside its demangled name, and has no file or line.
    #[test]
    fn a_function_named_by_its_symbol_keeps_the_symbol_as_written() {
        let function = FunctionLine::named(
            "app::work".into(),
            "_ZN3app4work17h0123456789abcdefE".into(),
        );
        assert_eq!(function.name, "app::work");
        assert_eq!(function.system_name, "_ZN3app4work17h0123456789abcdefE");
        assert_eq!(
            (
                function.filename.as_str(),
                function.line,
                function.start_line
            ),
            ("", 0, 0)
        );
    }
}
