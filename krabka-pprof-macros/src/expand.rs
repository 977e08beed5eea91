//! Code generation: checks the annotated item, then wraps its body so the routes are merged
//! into whatever router the body produced: under the layers of its returned expression
//! where it has some (`placement.rs`), after it otherwise. A body is parsed only to find
//! those layers; one that does not parse is moved as it is, so the user's own syntax and
//! type errors surface exactly as they would without the attribute.

use proc_macro2::{Span, TokenStream, TokenTree};
use quote::{ToTokens, quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::spanned::Spanned;
use syn::{Attribute, ReturnType, Signature, Type, Visibility};

use crate::args::{self, Args};

/// The annotated function: signature parsed, body kept as raw tokens.
struct FnItem {
    attrs: Vec<Attribute>,
    vis: Visibility,
    sig: Signature,
    body: TokenStream,
}

impl Parse for FnItem {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let attrs = input.call(Attribute::parse_outer)?;
        let vis: Visibility = input.parse()?;
        let sig: Signature = input.parse()?;
        if input.peek(syn::Token![;]) {
            return Err(syn::Error::new(
                input.span(),
                "`#[pprof_routes]` needs a function with a body that builds the `Router`; \
                 put it on the implementation, not on a declaration",
            ));
        }
        let body = match input.parse::<TokenTree>()? {
            TokenTree::Group(group) if group.delimiter() == proc_macro2::Delimiter::Brace => {
                group.into_token_stream()
            }
            other => return Err(syn::Error::new(other.span(), "expected the function body")),
        };
        if !input.is_empty() {
            return Err(input.error("unexpected tokens after the function body"));
        }
        Ok(FnItem {
            attrs,
            vis,
            sig,
            body,
        })
    }
}

/// Expands `#[pprof_routes(attr)] item`. Never fails: errors become `compile_error!`s
/// emitted beside the unchanged item, so the user's function still exists.
pub(crate) fn expand(attr: TokenStream, item: TokenStream) -> TokenStream {
    let parsed_item = parse_item(item.clone());
    let parsed_args = args::parse(attr);
    match (parsed_args, parsed_item) {
        (Ok(args), Ok(function)) => generate(&args, function),
        (args, function) => {
            let mut errors = args::Errors::default();
            for error in [args.err(), function.err()].into_iter().flatten() {
                errors.push(error);
            }
            let error = errors.finish().err().map(|e| e.into_compile_error());
            quote!(#item #error)
        }
    }
}

fn parse_item(item: TokenStream) -> syn::Result<FnItem> {
    let function: FnItem = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(fn_error) => return Err(not_a_function(item).unwrap_or(fn_error)),
    };
    if let Some(constness) = &function.sig.constness {
        return Err(syn::Error::new(
            constness.span(),
            "`#[pprof_routes]` cannot go on a `const fn`: building a `Router` is not const; remove `const`",
        ));
    }
    check_return_type(&function.sig)?;
    Ok(function)
}

/// If `item` is some other kind of item, an error saying what was found instead.
fn not_a_function(item: TokenStream) -> Option<syn::Error> {
    let item: syn::Item = syn::parse2(item).ok()?;
    let (span, found): (Span, &str) = match &item {
        syn::Item::Struct(s) => (s.struct_token.span, "a struct"),
        syn::Item::Enum(e) => (e.enum_token.span, "an enum"),
        syn::Item::Union(u) => (u.union_token.span, "a union"),
        syn::Item::Impl(i) => (
            i.impl_token.span,
            "an impl block; put it on a method inside",
        ),
        syn::Item::Trait(t) => (t.trait_token.span, "a trait"),
        syn::Item::Const(c) => (c.const_token.span, "a const"),
        syn::Item::Static(s) => (s.static_token.span, "a static"),
        syn::Item::Mod(m) => (m.mod_token.span, "a module"),
        syn::Item::Type(t) => (t.type_token.span, "a type alias"),
        syn::Item::Use(u) => (u.use_token.span, "a use declaration"),
        // A bodiless `fn` parses as verbatim tokens; the fn parser's error says more.
        syn::Item::Verbatim(_) | syn::Item::Fn(_) => return None,
        other => (other.span(), "an item that is not a function"),
    };
    Some(syn::Error::new(
        span,
        format!("`#[pprof_routes]` goes on a function that returns `axum::Router`, found {found}"),
    ))
}

fn check_return_type(sig: &Signature) -> syn::Result<()> {
    let ty = match &sig.output {
        ReturnType::Default => {
            return Err(syn::Error::new(
                sig.paren_token.span.close(),
                format!(
                    "`#[pprof_routes]` needs `{}` to declare that it returns `axum::Router`; add `-> Router`",
                    sig.ident
                ),
            ));
        }
        ReturnType::Type(_, ty) => ty,
    };
    if is_router(ty) {
        return Ok(());
    }
    let written = ty
        .to_token_stream()
        .to_string()
        .replace(" < ", "<")
        .replace(" >", ">");
    Err(syn::Error::new(
        ty.span(),
        format!(
            "`#[pprof_routes]` needs the function to return `axum::Router` or `axum::Router<S>`, found `{written}`"
        ),
    ))
}

/// `Router`, `Router<S>`, `axum::Router<S>`, any path ending in `Router` with at most one
/// type argument. Whether it is really axum's is checked by the type system in the
/// expansion (`__private::Routes`), with a message of its own.
fn is_router(ty: &Type) -> bool {
    let path = match ty {
        Type::Path(path) => path,
        // `$ret:ty` from a macro_rules! arrives wrapped in an invisible group.
        Type::Group(group) => return is_router(&group.elem),
        Type::Paren(paren) => return is_router(&paren.elem),
        _ => return false,
    };
    if path.qself.is_some() {
        return false;
    }
    let Some(last) = path.path.segments.last() else {
        return false;
    };
    if last.ident != "Router" {
        return false;
    }
    match &last.arguments {
        syn::PathArguments::None => true,
        syn::PathArguments::AngleBracketed(args) => {
            args.args.len() == 1 && matches!(args.args[0], syn::GenericArgument::Type(_))
        }
        syn::PathArguments::Parenthesized(_) => false,
    }
}

fn generate(args: &Args, function: FnItem) -> TokenStream {
    let FnItem {
        attrs,
        vis,
        sig,
        body,
    } = function;
    let krate = match &args.krate {
        Some(krate) => krate.value.to_token_stream(),
        None => quote!(::krabka_pprof),
    };
    let ReturnType::Type(_, ret) = &sig.output else {
        unreachable!("checked by check_return_type")
    };
    let config = config_expr(args, &krate);

    let heap_check = args.heap.as_ref().filter(|heap| heap.value).map(|heap| {
        let on = syn::LitBool::new(true, heap.span);
        quote_spanned!(heap.span=> #krate::__private::require_heap_profiling!(#on);)
    });
    let push_check = args.push.as_ref().filter(|push| push.value).map(|push| {
        let on = syn::LitBool::new(true, push.span);
        quote_spanned!(push.span=> #krate::__private::require_push!(#on);)
    });

    // The expansion's own locals resolve at the call site, whatever context the return
    // type's tokens come from (a `macro_rules!` may have written it); the merge call keeps
    // the return type's span so that a type error points there.
    let router = syn::Ident::new("__krabka_pprof_router", Span::call_site());
    let config_ref = syn::Ident::new("__krabka_pprof_config", Span::call_site());
    let placed = syn::Ident::new("__krabka_pprof_placed", Span::call_site());
    let router_at_ret = syn::Ident::new(
        "__krabka_pprof_router",
        Span::call_site().located_at(ret.span()),
    );
    let merge = quote_spanned!(ret.span()=>
        #krate::__private::merge(#router_at_ret, #config_ref, #placed)
    );
    let body = place_under_layers(body, &krate, &config_ref, &placed);

    let produce = if sig.asyncness.is_some() {
        quote!(async move #body.await)
    } else {
        quote!((move || -> #ret #body)())
    };

    // An inline `const` rather than a `static` item: it is still evaluated (and its
    // checks still panic) at compile time, and it may name `Self` and the function's
    // generics, as a `guard = Self::check` does.
    quote! {
        #(#attrs)*
        #vis #sig {
            let #config_ref: &'static #krate::ProfilingConfig = &const { #config };
            let #placed: &::core::cell::Cell<bool> = &::core::cell::Cell::new(false);
            #heap_check
            #push_check
            #[allow(clippy::redundant_closure_call, unused_mut)]
            let #router: #ret = #produce;
            #merge
        }
    }
}

/// The body with the routes placed under the layers of the router it returns
/// (`placement.rs`). A body that does not parse is moved as it is, so that its own errors
/// surface exactly as they would without the attribute.
fn place_under_layers(
    body: TokenStream,
    krate: &TokenStream,
    config_ref: &syn::Ident,
    placed: &syn::Ident,
) -> TokenStream {
    let Ok(mut block) = syn::parse2::<syn::Block>(body.clone()) else {
        return body;
    };
    let merge = quote!(#krate::__private::merge_under_layers);
    let args = quote!(#config_ref, #placed);
    if crate::placement::place(&mut block, &merge, &args) == 0 {
        return body;
    }
    block.into_token_stream()
}

/// `ProfilingConfig::new().with_…(…).checked()`: only the keys the user wrote, so the
/// runtime crate's defaults stay the one source of truth.
fn config_expr(args: &Args, krate: &TokenStream) -> TokenStream {
    let mut calls = TokenStream::new();
    let duration = |d: std::time::Duration| {
        let (secs, nanos) = (d.as_secs(), d.subsec_nanos());
        quote!(::core::time::Duration::new(#secs, #nanos))
    };
    if let Some(v) = &args.cpu_default {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_cpu_default(#d)));
    }
    if let Some(v) = &args.cpu_max {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_cpu_max(#d)));
    }
    if let Some(v) = &args.frequency {
        let hz = v.value;
        calls.extend(quote_spanned!(v.span=> .with_frequency(#hz)));
    }
    if let Some(v) = &args.frequency_max {
        let hz = v.value;
        calls.extend(quote_spanned!(v.span=> .with_frequency_max(#hz)));
    }
    if let Some(v) = &args.max_windows {
        let windows = v.value;
        calls.extend(quote_spanned!(v.span=> .with_max_windows(#windows)));
    }
    if let Some(v) = &args.blocklist {
        let names = &v.value;
        calls.extend(quote_spanned!(v.span=> .with_blocklist(&[#(#names),*])));
    }
    if let Some(v) = &args.heap {
        let on = v.value;
        calls.extend(quote_spanned!(v.span=> .with_heap(#on)));
    }
    if let Some(v) = &args.heap_default {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_heap_default(#d)));
    }
    if let Some(v) = &args.heap_max {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_heap_max(#d)));
    }
    if let Some(v) = &args.alloc_stacks {
        let stacks = v.value;
        calls.extend(quote_spanned!(v.span=> .with_alloc_stacks(#stacks)));
    }
    if let Some(v) = &args.cmdline {
        let on = v.value;
        calls.extend(quote_spanned!(v.span=> .with_cmdline(#on)));
    }
    if let Some(v) = &args.threads {
        let on = v.value;
        calls.extend(quote_spanned!(v.span=> .with_threads(#on)));
    }
    if let Some(v) = &args.recent {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_recent(#d)));
    }
    if let Some(v) = &args.recent_memory {
        // Checked against 1 GiB already, so it fits a `usize` on every target.
        let bytes = proc_macro2::Literal::u64_unsuffixed(v.value);
        calls.extend(quote_spanned!(v.span=> .with_recent_memory(#bytes)));
    }
    if let Some(v) = &args.push {
        let on = v.value;
        calls.extend(quote_spanned!(v.span=> .with_push(#on)));
    }
    if let Some(v) = &args.push_interval {
        let d = duration(v.value);
        calls.extend(quote_spanned!(v.span=> .with_push_interval(#d)));
    }
    if let Some(v) = &args.prefix {
        let prefix = &v.value;
        calls.extend(quote_spanned!(v.span=> .with_prefix(#prefix)));
    }
    if let Some(v) = &args.guard {
        let guard = &v.value;
        calls.extend(quote_spanned!(v.span=> .with_guard(#krate::__private::guard(#guard))));
    }
    if let Some(v) = &args.token_env {
        let name = &v.value;
        calls.extend(quote_spanned!(v.span=> .with_token_env(#name)));
    }
    quote!(#krate::ProfilingConfig::new() #calls .checked())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expand_str(attr: TokenStream, item: TokenStream) -> String {
        expand(attr, item).to_string()
    }

    #[test]
    fn keeps_signature_and_merges() {
        let out = expand_str(
            quote!(cpu_max = "2m"),
            quote!(
                /// Docs.
                pub(crate) fn app(x: u8) -> Router<AppState> {
                    Router::new()
                }
            ),
        );
        assert!(
            out.contains("pub (crate) fn app (x : u8) -> Router < AppState >"),
            "{out}"
        );
        assert!(
            out.contains("with_cpu_max (:: core :: time :: Duration :: new (120u64 , 0u32))"),
            "{out}"
        );
        assert!(
            out.contains(":: krabka_pprof :: __private :: merge"),
            "{out}"
        );
        assert!(out.contains("# [doc = r\" Docs.\"]"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn threads_reaches_the_config_only_when_written() {
        let item = quote!(
            fn app() -> Router {
                Router::new()
            }
        );
        let off = expand_str(quote!(threads = false), item.clone());
        assert!(off.contains(". with_threads (false)"), "{off}");
        let unset = expand_str(quote!(), item);
        assert!(!unset.contains("with_threads"), "{unset}");
    }

    #[test]
    fn cmdline_reaches_the_config_only_when_written() {
        let item = quote!(
            fn app() -> Router {
                Router::new()
            }
        );
        let on = expand_str(quote!(cmdline = true), item.clone());
        assert!(on.contains(". with_cmdline (true)"), "{on}");
        let unset = expand_str(quote!(), item);
        assert!(!unset.contains("with_cmdline"), "{unset}");
    }

    #[test]
    fn recent_reaches_the_config_in_bytes_and_duration() {
        let out = expand_str(
            quote!(recent = "10m", recent_memory = "2MiB"),
            quote!(
                fn app() -> Router {
                    Router::new()
                }
            ),
        );
        assert!(
            out.contains(". with_recent (:: core :: time :: Duration :: new (600u64 , 0u32))"),
            "{out}"
        );
        assert!(out.contains(". with_recent_memory (2097152)"), "{out}");
        assert!(!out.contains("compile_error"), "{out}");
    }

    #[test]
    fn async_bodies_are_awaited_in_place() {
        let out = expand_str(
            quote!(),
            quote!(
                async fn app() -> Router {
                    Router::new()
                }
            ),
        );
        assert!(
            out.contains("async move { Router :: new () } . await"),
            "{out}"
        );
    }

    #[test]
    fn crate_override_is_used_everywhere() {
        let out = expand_str(
            quote!(crate = "my::pp", heap = true),
            quote!(
                fn app() -> Router {
                    Router::new()
                }
            ),
        );
        assert!(!out.contains(":: krabka_pprof ::"), "{out}");
        assert!(
            out.contains("my :: pp :: __private :: require_heap_profiling !"),
            "{out}"
        );
        assert!(
            out.contains("my :: pp :: ProfilingConfig :: new ()"),
            "{out}"
        );
    }

    #[test]
    fn errors_keep_the_item() {
        let out = expand_str(
            quote!(frequency = 0),
            quote!(
                fn app() -> Router {
                    Router::new()
                }
            ),
        );
        assert!(
            out.starts_with("fn app () -> Router { Router :: new () }"),
            "{out}"
        );
        assert!(out.contains("compile_error"), "{out}");
    }

    #[test]
    fn return_type_shapes() {
        let accepted = [
            quote!(Router),
            quote!(axum::Router),
            quote!(::axum::Router<AppState>),
            quote!(Router<Arc<State>>),
        ];
        for ty in accepted {
            let ty: Type = syn::parse2(ty).unwrap();
            assert!(is_router(&ty), "{}", ty.to_token_stream());
        }
        // In parentheses, and in the invisible group a `macro_rules!`'s `$ret:ty` makes.
        let paren: Type = syn::parse2(quote!((Router<AppState>))).unwrap();
        assert!(matches!(paren, Type::Paren(_)) && is_router(&paren));
        let group = Type::Group(syn::TypeGroup {
            group_token: Default::default(),
            elem: Box::new(syn::parse2(quote!(axum::Router)).unwrap()),
        });
        assert!(is_router(&group));
        let group_of_other = Type::Group(syn::TypeGroup {
            group_token: Default::default(),
            elem: Box::new(syn::parse2(quote!(String)).unwrap()),
        });
        assert!(!is_router(&group_of_other));
        let rejected = [
            quote!(String),
            quote!(impl Into<Router>),
            quote!(Router<A, B>),
            quote!(Option<Router>),
            quote!(&Router),
            quote!(Router<'static>),
        ];
        for ty in rejected {
            let ty: Type = syn::parse2(ty).unwrap();
            assert!(!is_router(&ty), "{}", ty.to_token_stream());
        }
    }

    #[test]
    fn non_functions_are_named() {
        let out = expand_str(
            quote!(),
            quote!(
                struct App;
            ),
        );
        assert!(out.contains("found a struct"), "{out}");
        let out = expand_str(
            quote!(),
            quote!(
                fn app() {}
            ),
        );
        assert!(out.contains("add `-> Router`"), "{out}");
        let out = expand_str(
            quote!(),
            quote!(
                const fn app() -> Router {
                    todo()
                }
            ),
        );
        assert!(out.contains("const fn"), "{out}");
        let out = expand_str(
            quote!(),
            quote!(
                fn app() -> Router [Router::new()]
            ),
        );
        assert!(out.contains("expected the function body"), "{out}");
    }
}
