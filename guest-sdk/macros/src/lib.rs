//! The attributes of `datum-guest`: `#[filter]`, `#[map]`, `#[flat_map]`,
//! `#[transform]` and `#[init]` (use them through `datum_guest`).
//!
//! Each checks the function's signature, emits the function unchanged, and
//! adds the ABI v1 export that calls it (`datum_transform` or `datum_init`)
//! under `#[cfg(target_arch = "wasm32")]` only, so that natively the function
//! is plain Rust. What the export does with a batch belongs to
//! `datum_guest::abi`; this crate only writes the call.
//!
//! Wrong signatures are refused with an error on the offending tokens:
//! syntactic checks here (arity, by value or by reference, a `Result`
//! return, no `async`, no generics), type checks through traits of
//! `datum_guest::__private` whose `#[diagnostic::on_unimplemented]` messages
//! name the expected type. Two transforms, or two inits, in one crate collide
//! on a `#[macro_export]` marker named after their export.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{ToTokens, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::{FnArg, ItemFn, ReturnType, Type};

/// Keeps the changes for which the function answers `true`:
/// `#[filter] fn keep(change: &Change) -> Result<bool>`.
///
/// The module answers the host with the kept changes' indexes; no change is
/// re-encoded. An error blames the change.
#[proc_macro_attribute]
pub fn filter(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(&FILTER, attr.into(), item.into()).into()
}

/// Replaces each change by the one the function returns:
/// `#[map] fn f(change: Change) -> Result<Change>`, or
/// `-> Result<Option<Change>>` to drop some.
///
/// A returned change that encodes to the input's exact bytes is answered by
/// its index. An error blames the change.
#[proc_macro_attribute]
pub fn map(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(&MAP, attr.into(), item.into()).into()
}

/// Replaces each change by the changes the function returns:
/// `#[flat_map] fn f(change: Change) -> Result<Vec<Change>>`.
///
/// A returned change that encodes to the input's exact bytes is answered by
/// its index. An error blames the change.
#[proc_macro_attribute]
pub fn flat_map(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(&FLAT_MAP, attr.into(), item.into()).into()
}

/// Transforms a whole batch: `#[transform] fn f(batch: Batch) ->
/// Result<Vec<Output>>` (or `-> Result<Vec<Change>>`; or take a `LazyBatch`
/// to decode changes only on demand).
///
/// `Output::Keep(i)` answers with input change `i` unchanged.
#[proc_macro_attribute]
pub fn transform(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(&TRANSFORM, attr.into(), item.into()).into()
}

/// Receives the module's configuration, once per instance, before any batch:
/// `#[init] fn init(config: Config) -> Result<()>`. An error fails the
/// module's loading with its message.
#[proc_macro_attribute]
pub fn init(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand(&INIT, attr.into(), item.into()).into()
}

/// How the one argument is passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// `&T`.
    ByRef,
    /// `T`.
    ByValue,
}

/// What one attribute accepts and generates.
#[derive(Debug)]
struct Kind {
    /// The attribute's name.
    name: &'static str,
    /// The signature it wants, for messages.
    signature: &'static str,
    /// How the argument is passed.
    pass: Pass,
    /// The argument's expected type, for messages.
    argument: &'static str,
    /// The return type it wants, for messages.
    returns: &'static str,
    /// The trait of `__private` the argument type must implement.
    argument_trait: &'static str,
    /// The trait of `__private` the return type must implement.
    result_trait: &'static str,
    /// The driver in `__private`.
    driver: &'static str,
    /// The export.
    export: &'static str,
    /// The `#[macro_export]` marker that makes a second such function in the
    /// crate a compile error which names the rule.
    marker: &'static str,
}

const FILTER: Kind = Kind {
    name: "filter",
    signature: "fn keep(change: &Change) -> Result<bool>",
    pass: Pass::ByRef,
    argument: "&Change",
    returns: "Result<bool>",
    argument_trait: "FilterArgument",
    result_trait: "FilterResult",
    driver: "filter",
    export: "datum_transform",
    marker: "one_datum_transform_per_module",
};

const MAP: Kind = Kind {
    name: "map",
    signature: "fn f(change: Change) -> Result<Change>",
    pass: Pass::ByValue,
    argument: "Change",
    returns: "Result<Change>",
    argument_trait: "ChangeArgument",
    result_trait: "MapResult",
    driver: "map",
    export: "datum_transform",
    marker: "one_datum_transform_per_module",
};

const FLAT_MAP: Kind = Kind {
    name: "flat_map",
    signature: "fn f(change: Change) -> Result<Vec<Change>>",
    pass: Pass::ByValue,
    argument: "Change",
    returns: "Result<Vec<Change>>",
    argument_trait: "ChangeArgument",
    result_trait: "FlatMapResult",
    driver: "flat_map",
    export: "datum_transform",
    marker: "one_datum_transform_per_module",
};

const TRANSFORM: Kind = Kind {
    name: "transform",
    signature: "fn f(batch: Batch) -> Result<Vec<Output>>",
    pass: Pass::ByValue,
    argument: "Batch",
    returns: "Result<Vec<Output>>",
    argument_trait: "TransformInput",
    result_trait: "TransformResult",
    driver: "transform",
    export: "datum_transform",
    marker: "one_datum_transform_per_module",
};

const INIT: Kind = Kind {
    name: "init",
    signature: "fn init(config: Config) -> Result<()>",
    pass: Pass::ByValue,
    argument: "Config",
    returns: "Result<()>",
    argument_trait: "InitArgument",
    result_trait: "InitResult",
    driver: "init",
    export: "datum_init",
    marker: "one_datum_init_per_module",
};

fn expand(kind: &Kind, attr: TokenStream2, item: TokenStream2) -> TokenStream2 {
    let function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let message = format!(
                "`#[{}]` applies to a function: `{}`",
                kind.name, kind.signature
            );
            let error = syn::Error::new_spanned(&item, message).to_compile_error();
            return quote!(#error #item);
        }
    };
    let mut errors = Vec::new();
    let per_change = matches!(kind.driver, "filter" | "map" | "flat_map");
    let mut schema_changes = false;
    if !attr.is_empty() {
        if per_change && attr.to_string() == "schema_changes" {
            schema_changes = true;
        } else if per_change {
            errors.push(syn::Error::new_spanned(
                &attr,
                format!(
                    "`#[{}]` takes no arguments but `schema_changes` (the function then sees \
                     `schema` changes too)",
                    kind.name
                ),
            ));
        } else {
            errors.push(syn::Error::new_spanned(
                &attr,
                format!("`#[{}]` takes no arguments", kind.name),
            ));
        }
    }
    let (argument, result) = check_signature(kind, &function, &mut errors);
    if let Some(first) = errors.into_iter().reduce(|mut all, e| {
        all.combine(e);
        all
    }) {
        let error = first.to_compile_error();
        return quote!(#error #function);
    }
    let (Some(argument), Some(result)) = (argument, result) else {
        // `check_signature` reports an error whenever it finds no type.
        return function.into_token_stream();
    };
    generate(
        kind,
        &function,
        argument,
        result,
        per_change.then_some(schema_changes),
    )
}

/// Checks what can be checked on the tokens; returns the argument and the
/// return types for the type checks.
fn check_signature<'f>(
    kind: &Kind,
    function: &'f ItemFn,
    errors: &mut Vec<syn::Error>,
) -> (Option<&'f Type>, Option<&'f Type>) {
    let sig = &function.sig;
    let name = kind.name;
    if let Some(token) = &sig.asyncness {
        errors.push(syn::Error::new_spanned(
            token,
            format!("a `#[{name}]` function cannot be `async`: the host calls it synchronously"),
        ));
    }
    if let Some(token) = &sig.unsafety {
        errors.push(syn::Error::new_spanned(
            token,
            format!("a `#[{name}]` function cannot be `unsafe`"),
        ));
    }
    if let Some(abi) = &sig.abi {
        errors.push(syn::Error::new_spanned(
            abi,
            format!(
                "a `#[{name}]` function is plain Rust: remove `extern`, the attribute writes the export"
            ),
        ));
    }
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        errors.push(syn::Error::new_spanned(
            &sig.generics,
            format!(
                "a `#[{name}]` function cannot be generic: the export needs one concrete function"
            ),
        ));
    }
    if let Some(variadic) = &sig.variadic {
        errors.push(syn::Error::new_spanned(
            variadic,
            format!("a `#[{name}]` function takes exactly one argument"),
        ));
    }

    let argument = match sig.inputs.len() {
        1 => match &sig.inputs[0] {
            FnArg::Receiver(receiver) => {
                errors.push(syn::Error::new_spanned(
                    receiver,
                    format!(
                        "a `#[{name}]` function is a free function, not a method: `{}`",
                        kind.signature
                    ),
                ));
                None
            }
            FnArg::Typed(pat) => check_argument(kind, &pat.ty, errors),
        },
        0 => {
            errors.push(syn::Error::new(
                sig.paren_token.span.join(),
                format!(
                    "a `#[{name}]` function takes one argument, `{}`: `{}`",
                    kind.argument, kind.signature
                ),
            ));
            None
        }
        n => {
            errors.push(syn::Error::new_spanned(
                &sig.inputs,
                format!(
                    "a `#[{name}]` function takes one argument, `{}`, not {n}: `{}`",
                    kind.argument, kind.signature
                ),
            ));
            None
        }
    };

    let result = match &sig.output {
        ReturnType::Default => {
            errors.push(syn::Error::new_spanned(
                &sig.ident,
                format!(
                    "a `#[{name}]` function returns `{}` (`datum_guest::Result`): `{}`",
                    kind.returns, kind.signature
                ),
            ));
            None
        }
        ReturnType::Type(_, ty) => {
            if is_result(ty) {
                Some(&**ty)
            } else {
                errors.push(syn::Error::new_spanned(
                    ty,
                    format!(
                        "a `#[{name}]` function returns `{}` (`datum_guest::Result`), not `{}`",
                        kind.returns,
                        ty.to_token_stream()
                    ),
                ));
                None
            }
        }
    };
    (argument, result)
}

fn check_argument<'f>(kind: &Kind, ty: &'f Type, errors: &mut Vec<syn::Error>) -> Option<&'f Type> {
    let name = kind.name;
    if let Type::ImplTrait(_) = ty {
        errors.push(syn::Error::new_spanned(
            ty,
            format!(
                "a `#[{name}]` function cannot be generic: take `{}`",
                kind.argument
            ),
        ));
        return None;
    }
    match (kind.pass, ty) {
        (Pass::ByRef, Type::Reference(reference)) if reference.mutability.is_some() => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "a `#[{name}]` function takes the change by shared reference, `{}`; to change it, use `#[map]`",
                    kind.argument
                ),
            ));
            None
        }
        (Pass::ByRef, Type::Reference(_)) => Some(ty),
        (Pass::ByRef, _) => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "a `#[{name}]` function takes the change by reference, `{}`",
                    kind.argument
                ),
            ));
            None
        }
        (Pass::ByValue, Type::Reference(_)) => {
            errors.push(syn::Error::new_spanned(
                ty,
                format!(
                    "a `#[{name}]` function takes its argument by value, `{}`",
                    kind.argument
                ),
            ));
            None
        }
        (Pass::ByValue, _) => Some(ty),
    }
}

/// Whether a type is spelled `Result<..>` (any path ending in `Result`).
fn is_result(ty: &Type) -> bool {
    match ty {
        Type::Path(path) => path
            .path
            .segments
            .last()
            .is_some_and(|s| s.ident == "Result"),
        Type::Group(group) => is_result(&group.elem),
        Type::Paren(paren) => is_result(&paren.elem),
        _ => false,
    }
}

/// `schema_changes`: for a per-change attribute, whether the function sees
/// `schema` changes (`None` for the others).
fn generate(
    kind: &Kind,
    function: &ItemFn,
    argument: &Type,
    result: &Type,
    schema_changes: Option<bool>,
) -> TokenStream2 {
    let ident = &function.sig.ident;
    let private = quote!(::datum_guest::__private);
    let argument_trait = syn::Ident::new(kind.argument_trait, Span::call_site());
    let result_trait = syn::Ident::new(kind.result_trait, Span::call_site());
    let driver = syn::Ident::new(kind.driver, Span::call_site());
    let export = syn::Ident::new(kind.export, Span::call_site());
    let marker = syn::Ident::new(kind.marker, Span::call_site());

    // Type checks on every target, each spanned at the type it checks so that
    // the trait's message points there.
    let check_argument = quote_spanned! {argument.span()=>
        const _: () = {
            const fn implements<T: ?::core::marker::Sized + #private::#argument_trait>() {}
            implements::<#argument>();
        };
    };
    let check_result = quote_spanned! {result.span()=>
        const _: () = {
            const fn implements<T: ?::core::marker::Sized + #private::#result_trait>() {}
            implements::<#result>();
        };
    };

    let call = if kind.export == "datum_init" {
        quote! {
            // SAFETY: the host calls the export as docs/abi.md says.
            unsafe { #private::init_entry(ptr, len, |input| #private::#driver(input, #ident)) }
        }
    } else {
        let extra = schema_changes.map(|see| quote!(, #see));
        quote! {
            // SAFETY: the host calls the export as docs/abi.md says.
            unsafe { #private::transform_entry(ptr, len, |input| #private::#driver(input, #ident #extra)) }
        }
    };

    quote! {
        #function

        #check_argument
        #check_result

        // Natively no export calls the function: this use keeps a private
        // `fn` from being reported as never used in `cargo test` builds.
        const _: () = {
            let _ = #ident;
        };

        // A second transform (or init) anywhere in the crate collides here.
        #[doc(hidden)]
        #[macro_export]
        macro_rules! #marker {
            () => {};
        }

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            #[unsafe(no_mangle)]
            pub extern "C" fn #export(ptr: u32, len: u32) -> u64 {
                #call
            }
        };
    }
}
