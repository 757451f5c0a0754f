//! `#[case]`: marks a function of `rdapl-conformance` as a case of the
//! suite.
//!
//! The function is kept as written and registered (with `inventory`)
//! under its module path and name, so `rdapl_conformance::Suite` finds
//! every case without a list kept by hand. It must take no arguments; a
//! panic fails the case, as in a `#[test]`. Only `rdapl-conformance`
//! itself uses it: the expansion names that crate's `Case` type.

use proc_macro::{Delimiter, Group, Ident, Punct, Spacing, Span, TokenStream, TokenTree};

/// Registers the function that follows as a conformance case.
#[proc_macro_attribute]
pub fn case(attr: TokenStream, item: TokenStream) -> TokenStream {
    if !attr.is_empty() {
        return error("#[case] takes no arguments");
    }
    let mut after_fn = false;
    let mut name = None;
    for t in item.clone() {
        if let TokenTree::Ident(i) = &t {
            if after_fn {
                name = Some(i.clone());
                break;
            }
            after_fn = i.to_string() == "fn";
        }
    }
    let Some(name) = name else {
        return error("#[case] goes on a function");
    };
    let reg = format!(
        "::inventory::submit! {{ crate::Case::new(::core::module_path!(), {:?}, {name}) }}",
        name.to_string()
    );
    let mut out = item;
    match reg.parse::<TokenStream>() {
        Ok(r) => out.extend(r),
        Err(_) => return error("#[case]: the function's name does not make a path"),
    }
    out
}

/// `compile_error!(msg)`.
fn error(msg: &str) -> TokenStream {
    let span = Span::call_site();
    let lit = TokenTree::Literal(proc_macro::Literal::string(msg));
    [
        TokenTree::Ident(Ident::new("compile_error", span)),
        TokenTree::Punct(Punct::new('!', Spacing::Alone)),
        TokenTree::Group(Group::new(Delimiter::Parenthesis, lit.into())),
        TokenTree::Punct(Punct::new(';', Spacing::Alone)),
    ]
    .into_iter()
    .collect()
}
