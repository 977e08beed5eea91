//! Where the profiling routes go in the annotated function's body: before the first
//! `.layer(…)` or `.route_layer(…)` of the router it returns, so that the layers a team
//! puts on its router (authentication above all) cover them as they cover its own
//! routes. axum applies a layer to the routes a router has when `.layer` is called, so
//! routes merged after the body returns would be outside every layer of the body.
//!
//! The returned expressions are the body's tail and its `return`s (not those of nested
//! closures, async blocks or items), and inside them the branches of `if`, `match` and
//! blocks; a tail that names a variable stands for the `let` that last bound it, when
//! the body has no `return` and nothing assigns the variable after. Anything else (a
//! layer applied in a helper function) is not seen, and the routes are merged after the
//! body as before: the docs say to apply such layers where the function is called.

use proc_macro2::TokenStream;
use quote::quote_spanned;
use syn::visit_mut::{self, VisitMut};
use syn::{Block, Expr, Pat, Stmt};

/// Rewrites `block` so that each returned router chain with a layer calls `merge` on the
/// receiver of its first layer: `merge(Router::new().route(…)).layer(auth)`. `merge` is
/// the path of the runtime's function, `args` what follows the router in its call.
/// Returns how many places were rewritten.
pub(crate) fn place(block: &mut Block, merge: &TokenStream, args: &TokenStream) -> usize {
    let mut placer = Placer {
        merge,
        args,
        placed: 0,
    };
    let has_return = {
        let mut finder = ReturnFinder { found: false };
        finder.visit_block_mut(block);
        finder.found
    };
    if has_return {
        let mut returns = Returns {
            placer: &mut placer,
        };
        returns.visit_block_mut(block);
    }
    placer.in_block(block, !has_return);
    placer.placed
}

struct Placer<'a> {
    merge: &'a TokenStream,
    args: &'a TokenStream,
    placed: usize,
}

impl Placer<'_> {
    /// The block's tail, and, where `follow_lets`, the `let` behind a tail variable.
    fn in_block(&mut self, block: &mut Block, follow_lets: bool) {
        let Some(Stmt::Expr(tail, None)) = block.stmts.last_mut() else {
            return;
        };
        if self.in_expr(tail) || !follow_lets {
            return;
        }
        let Some(name) = single_ident(tail) else {
            return;
        };
        let last = block.stmts.len() - 1;
        let Some(at) = block.stmts[..last]
            .iter()
            .rposition(|stmt| binds(stmt, &name))
        else {
            return;
        };
        if block.stmts[at + 1..last]
            .iter()
            .any(|stmt| assigns(stmt, &name))
        {
            return;
        }
        if let Stmt::Local(local) = &mut block.stmts[at]
            && let Some(init) = &mut local.init
            && init.diverge.is_none()
        {
            self.in_expr(&mut init.expr);
        }
    }

    /// Places the routes in a returned expression; whether it did.
    fn in_expr(&mut self, expr: &mut Expr) -> bool {
        match expr {
            Expr::MethodCall(_) => self.in_chain(expr),
            Expr::Paren(inner) => self.in_expr(&mut inner.expr),
            Expr::Group(inner) => self.in_expr(&mut inner.expr),
            Expr::Block(inner) => {
                let before = self.placed;
                self.in_block(&mut inner.block, false);
                self.placed > before
            }
            Expr::If(inner) => {
                let before = self.placed;
                self.in_block(&mut inner.then_branch, false);
                if let Some((_, otherwise)) = &mut inner.else_branch {
                    self.in_expr(otherwise);
                }
                self.placed > before
            }
            Expr::Match(inner) => {
                let before = self.placed;
                for arm in &mut inner.arms {
                    self.in_expr(&mut arm.body);
                }
                self.placed > before
            }
            _ => false,
        }
    }

    /// In a method-call chain, the call of `layer` or `route_layer` nearest its root: its
    /// receiver becomes `merge(receiver, args)`.
    fn in_chain(&mut self, expr: &mut Expr) -> bool {
        let mut depth_of_first = None;
        let mut depth = 0;
        let mut cursor: &Expr = expr;
        while let Expr::MethodCall(call) = cursor {
            if call.method == "layer" || call.method == "route_layer" {
                depth_of_first = Some(depth);
            }
            cursor = &call.receiver;
            depth += 1;
        }
        let Some(target) = depth_of_first else {
            return false;
        };
        let mut cursor: &mut Expr = expr;
        for _ in 0..target {
            let Expr::MethodCall(call) = cursor else {
                unreachable!("counted above")
            };
            cursor = &mut call.receiver;
        }
        let Expr::MethodCall(call) = cursor else {
            unreachable!("counted above")
        };
        let receiver = &call.receiver;
        let (merge, args) = (self.merge, self.args);
        let placed: TokenStream = quote_spanned!(call.method.span()=> #merge(#receiver, #args));
        *call.receiver = syn::parse2(placed).expect("a call expression");
        self.placed += 1;
        true
    }
}

/// `x` of a tail that is a lone variable.
fn single_ident(expr: &Expr) -> Option<syn::Ident> {
    let Expr::Path(path) = expr else { return None };
    (path.qself.is_none() && path.attrs.is_empty())
        .then(|| path.path.get_ident().cloned())
        .flatten()
}

/// Whether `stmt` is `let x = …` or `let mut x = …`.
fn binds(stmt: &Stmt, name: &syn::Ident) -> bool {
    let Stmt::Local(local) = stmt else {
        return false;
    };
    let pat = match &local.pat {
        Pat::Type(typed) => &*typed.pat,
        other => other,
    };
    matches!(pat, Pat::Ident(ident) if ident.ident == *name && ident.subpat.is_none())
}

/// Whether `stmt` assigns `name` anywhere (`name = …`), which hides what the `let` bound.
fn assigns(stmt: &Stmt, name: &syn::Ident) -> bool {
    struct Assigns<'a> {
        name: &'a syn::Ident,
        found: bool,
    }
    impl VisitMut for Assigns<'_> {
        fn visit_expr_assign_mut(&mut self, assign: &mut syn::ExprAssign) {
            if single_ident(&assign.left).is_some_and(|left| left == *self.name) {
                self.found = true;
            }
            visit_mut::visit_expr_assign_mut(self, assign);
        }
    }
    let mut visitor = Assigns { name, found: false };
    visitor.visit_stmt_mut(&mut stmt.clone());
    visitor.found
}

/// Finds a `return` of the body itself.
struct ReturnFinder {
    found: bool,
}

impl VisitMut for ReturnFinder {
    fn visit_expr_return_mut(&mut self, _: &mut syn::ExprReturn) {
        self.found = true;
    }
    fn visit_expr_closure_mut(&mut self, _: &mut syn::ExprClosure) {}
    fn visit_expr_async_mut(&mut self, _: &mut syn::ExprAsync) {}
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

/// Places the routes in each `return` of the body itself.
struct Returns<'p, 'a> {
    placer: &'p mut Placer<'a>,
}

impl VisitMut for Returns<'_, '_> {
    fn visit_expr_return_mut(&mut self, ret: &mut syn::ExprReturn) {
        if let Some(expr) = &mut ret.expr {
            self.placer.in_expr(expr);
        }
    }
    fn visit_expr_closure_mut(&mut self, _: &mut syn::ExprClosure) {}
    fn visit_expr_async_mut(&mut self, _: &mut syn::ExprAsync) {}
    fn visit_item_mut(&mut self, _: &mut syn::Item) {}
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::place;

    fn placed(body: proc_macro2::TokenStream) -> (String, usize) {
        let mut block: syn::Block = syn::parse2(body).unwrap();
        let count = place(&mut block, &quote!(merge), &quote!(cfg, flag));
        (quote!(#block).to_string(), count)
    }

    #[test]
    fn the_first_layer_of_the_tail_chain_gets_the_routes_beneath_it() {
        let (out, count) = placed(quote!({
            Router::new()
                .route("/", get(h))
                .layer(auth)
                .route("/open", get(o))
                .layer(trace)
        }));
        assert_eq!(count, 1);
        assert!(
            out.contains(
                "merge (Router :: new () . route (\"/\" , get (h)) , cfg , flag) . layer (auth)"
            ),
            "{out}"
        );
    }

    #[test]
    fn route_layer_counts_as_a_layer() {
        let (out, _) = placed(quote!({
            Router::new().route("/", get(h)).route_layer(auth)
        }));
        assert!(out.contains("merge (Router :: new () . route (\"/\" , get (h)) , cfg , flag) . route_layer (auth)"), "{out}");
    }

    #[test]
    fn a_chain_without_a_layer_is_left_alone() {
        let body = quote!({ Router::new().route("/", get(h).layer(inner)) });
        let (out, count) = placed(body.clone());
        assert_eq!(
            count, 0,
            "a layer inside an argument is not the router's: {out}"
        );
        assert!(!out.contains("merge"), "{out}");
    }

    #[test]
    fn a_tail_variable_stands_for_its_last_let() {
        let (out, count) = placed(quote!({
            let app = Router::new().route("/", get(h));
            let app = app.layer(auth);
            app
        }));
        assert_eq!(count, 1);
        assert!(
            out.contains("let app = merge (app , cfg , flag) . layer (auth)"),
            "{out}"
        );
        assert!(
            out.contains("let app = Router :: new () . route"),
            "the first let is not the one returned: {out}"
        );
    }

    #[test]
    fn a_let_is_not_followed_where_a_return_or_an_assignment_could_bypass_it() {
        let (out, count) = placed(quote!({
            let app = Router::new().layer(auth);
            if other {
                return plain;
            }
            app
        }));
        assert_eq!(count, 0, "{out}");
        let (out, count) = placed(quote!({
            let mut app = Router::new().layer(auth);
            app = Router::new();
            app
        }));
        assert_eq!(count, 0, "{out}");
    }

    #[test]
    fn returns_branches_and_blocks_are_returned_expressions() {
        let (out, count) = placed(quote!({
            if quiet {
                return Router::new().layer(a);
            }
            match mode {
                Mode::One => Router::new().layer(b),
                Mode::Two => Router::new().route_layer(c),
            }
        }));
        assert_eq!(count, 3, "{out}");
        for layer in ["layer (a)", "layer (b)", "route_layer (c)"] {
            assert!(
                out.contains(&format!("merge (Router :: new () , cfg , flag) . {layer}")),
                "{out}"
            );
        }
    }

    #[test]
    fn returns_of_closures_async_blocks_and_items_are_not_the_functions() {
        let (out, count) = placed(quote!({
            let make = || {
                return Router::new().layer(a);
            };
            fn inner() -> Router {
                return Router::new().layer(b);
            }
            Router::new()
        }));
        assert_eq!(count, 0, "{out}");
    }
}
