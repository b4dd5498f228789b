//! The expansion of `#[tool]`.

use proc_macro2::{Span, TokenStream};
use quote::{format_ident, quote};
use syn::{
    Attribute, FnArg, GenericArgument, Ident, ItemFn, LitStr, Pat, Path, PathArguments, ReturnType,
    Type, TypeParamBound, ext::IdentExt, spanned::Spanned,
};

use crate::{
    description::{collapse, doc_strings},
    options::{Options, check_name},
};

/// Entry point: the original function (cleaned) followed by its `<name>_tool()` builder, or the
/// function followed by compile errors.
pub(crate) fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    let mut function: ItemFn = match syn::parse2(item.clone()) {
        Ok(function) => function,
        Err(_) => {
            let error = syn::Error::new(
                Span::call_site(),
                "#[tool] applies to a function (`fn` or `async fn`)",
            )
            .to_compile_error();
            return quote!(#error #item);
        }
    };
    // The helper attributes are removed first so that the function stays valid on error.
    let params = take_params(&mut function);
    match Options::parse(attr).and_then(|options| expand(&options, &function, params)) {
        Ok(builder) => quote!(#function #builder),
        Err(error) => {
            let error = error.to_compile_error();
            quote!(#function #error)
        }
    }
}

/// What a parameter of the tool function is.
enum Role {
    /// The injected `ToolContext`, by value or by reference.
    Context { by_ref: bool },
    /// `#[args]`: the whole arguments object.
    Args { ty: Type },
    /// One property of the generated arguments struct.
    Field {
        name: Ident,
        ty: Type,
        /// Doc, `serde` and `schemars` attributes moved onto the field.
        attrs: Vec<Attribute>,
        /// Whether `serde` attributes change how it deserializes.
        custom_serde: bool,
    },
}

/// A parameter after the helper attributes were taken off the function.
struct Param {
    role: syn::Result<Role>,
}

/// Takes the helper attributes off the parameters and classifies them.
fn take_params(function: &mut ItemFn) -> Vec<Param> {
    let mut params = Vec::new();
    for input in &mut function.sig.inputs {
        let FnArg::Typed(pat_type) = input else {
            params.push(Param {
                role: Err(syn::Error::new(
                    input.span(),
                    "#[tool] applies to free functions, not methods",
                )),
            });
            continue;
        };
        let mut is_args = None;
        let mut moved = Vec::new();
        let mut errors: Option<syn::Error> = None;
        let mut kept = Vec::new();
        for attr in std::mem::take(&mut pat_type.attrs) {
            if attr.path().is_ident("args") {
                if let Err(error) = attr.meta.require_path_only() {
                    push_error(&mut errors, error);
                }
                is_args = Some(attr.path().span());
            } else if ["doc", "serde", "schemars"]
                .iter()
                .any(|name| attr.path().is_ident(name))
            {
                moved.push(attr);
            } else {
                kept.push(attr);
            }
        }
        pat_type.attrs = kept;

        let ty = (*pat_type.ty).clone();
        let role = if let Some(by_ref) = context_type(&ty) {
            if let Some(span) = is_args {
                push_error(
                    &mut errors,
                    syn::Error::new(span, "a ToolContext parameter cannot be `#[args]`"),
                );
            }
            if let Some(attr) = moved.iter().find(|attr| !attr.path().is_ident("doc")) {
                push_error(
                    &mut errors,
                    syn::Error::new_spanned(attr, "the ToolContext parameter is not an argument"),
                );
            }
            Ok(Role::Context { by_ref })
        } else if is_args.is_some() {
            if let Some(attr) = moved.iter().find(|attr| !attr.path().is_ident("doc")) {
                push_error(
                    &mut errors,
                    syn::Error::new_spanned(
                        attr,
                        "put serde and schemars attributes on the `#[args]` type itself",
                    ),
                );
            }
            Ok(Role::Args { ty })
        } else {
            field_role(&pat_type.pat, ty, moved)
        };
        let role = match (role, errors) {
            (Ok(role), None) => Ok(role),
            (Ok(_), Some(errors)) => Err(errors),
            (Err(mut error), Some(errors)) => {
                error.combine(errors);
                Err(error)
            }
            (Err(error), None) => Err(error),
        };
        params.push(Param { role });
    }
    params
}

fn field_role(pat: &Pat, ty: Type, attrs: Vec<Attribute>) -> syn::Result<Role> {
    let Pat::Ident(pat_ident) = pat else {
        return Err(syn::Error::new_spanned(
            pat,
            "a tool parameter must be a plain name (or mark a struct parameter `#[args]`)",
        ));
    };
    if pat_ident.by_ref.is_some() || pat_ident.subpat.is_some() {
        return Err(syn::Error::new_spanned(
            pat,
            "a tool parameter must be a plain name",
        ));
    }
    if pat_ident.ident == "_" || pat_ident.ident.to_string().starts_with("__loom") {
        return Err(syn::Error::new_spanned(
            pat,
            "this name cannot be a tool parameter",
        ));
    }
    match &ty {
        Type::Reference(reference) => {
            return Err(syn::Error::new_spanned(
                reference,
                "tool arguments are deserialized into owned values: use an owned type \
                 (`String` rather than `&str`)",
            ));
        }
        Type::ImplTrait(_) => {
            return Err(syn::Error::new_spanned(
                &ty,
                "a tool argument needs a concrete type",
            ));
        }
        _ => {}
    }
    let custom_serde = attrs.iter().any(|attr| attr.path().is_ident("serde"));
    Ok(Role::Field {
        name: pat_ident.ident.clone(),
        ty,
        attrs,
        custom_serde,
    })
}

fn push_error(errors: &mut Option<syn::Error>, error: syn::Error) {
    match errors {
        Some(errors) => errors.combine(error),
        None => *errors = Some(error),
    }
}

/// `Some(by_ref)` when the type is `ToolContext` or `&ToolContext` (any path ending so).
fn context_type(ty: &Type) -> Option<bool> {
    match ty {
        Type::Path(path) if path.qself.is_none() && last_is(&path.path, "ToolContext") => {
            Some(false)
        }
        Type::Reference(reference) if reference.mutability.is_none() => {
            context_type(&reference.elem)
                .filter(|by_ref| !by_ref)
                .map(|_| true)
        }
        Type::Paren(paren) => context_type(&paren.elem),
        Type::Group(group) => context_type(&group.elem),
        _ => None,
    }
}

fn last_is(path: &Path, name: &str) -> bool {
    path.segments
        .last()
        .is_some_and(|segment| segment.ident == name)
}

/// How the function's return value becomes a `ToolOutput`.
struct Output {
    /// Whether the function returns a `Result` whose error maps to a `ToolError`.
    fallible: bool,
    /// Whether the success value converts through `IntoToolOutput` (else through `Json`).
    into_output: bool,
}

fn output_kind(output: &ReturnType) -> Output {
    let ty = match output {
        ReturnType::Default => {
            return Output {
                fallible: false,
                into_output: true,
            };
        }
        ReturnType::Type(_, ty) => strip_groups(ty),
    };
    if let Type::Path(path) = ty
        && path.qself.is_none()
        && let Some(segment) = path.path.segments.last()
        && segment.ident == "Result"
        && let PathArguments::AngleBracketed(arguments) = &segment.arguments
        && let Some(GenericArgument::Type(ok)) = arguments.args.first()
    {
        return Output {
            fallible: true,
            into_output: converts_into_output(ok),
        };
    }
    Output {
        fallible: false,
        into_output: converts_into_output(ty),
    }
}

fn strip_groups(mut ty: &Type) -> &Type {
    loop {
        match ty {
            Type::Paren(paren) => ty = &paren.elem,
            Type::Group(group) => ty = &group.elem,
            _ => return ty,
        }
    }
}

/// The types known (syntactically) to implement `IntoToolOutput`.
fn converts_into_output(ty: &Type) -> bool {
    match strip_groups(ty) {
        Type::Tuple(tuple) => tuple.elems.is_empty(),
        Type::Reference(reference) => matches!(
            strip_groups(&reference.elem),
            Type::Path(path) if path.qself.is_none() && path.path.is_ident("str")
        ),
        Type::Path(path) if path.qself.is_none() => path.path.segments.last().is_some_and(|last| {
            [
                "String",
                "ToolOutput",
                "Value",
                "Json",
                "Views",
                "Image",
                "ToolFile",
            ]
                .iter()
                .any(|name| last.ident == name)
        }),
        Type::ImplTrait(impl_trait) => impl_trait.bounds.iter().any(|bound| {
            matches!(bound, TypeParamBound::Trait(bound) if last_is(&bound.path, "IntoToolOutput"))
        }),
        _ => false,
    }
}

/// The `<name>_tool()` function, or every mistake found (signature, parameters, name,
/// description) as one combined error.
fn expand(options: &Options, function: &ItemFn, params: Vec<Param>) -> syn::Result<TokenStream> {
    let mut errors: Option<syn::Error> = None;
    let sig = &function.sig;
    check_signature(sig, &mut errors);
    if options.inline && sig.asyncness.is_some() {
        push_error(
            &mut errors,
            syn::Error::new_spanned(
                sig.asyncness,
                "`inline` is for a sync function: an async one already runs on the call's task",
            ),
        );
    }
    if options.inline && options.timeout.is_some() {
        push_error(
            &mut errors,
            syn::Error::new(
                sig.ident.span(),
                "`inline` and `timeout` together: a timeout cannot interrupt a function called \
                 in place; leave `inline` out to run it on the blocking pool",
            ),
        );
    }
    let roles = roles(params, &mut errors);
    let args_ty = args_param(&roles, &mut errors);
    let krate = options
        .krate
        .clone()
        .unwrap_or_else(|| syn::parse_quote!(::loom_ia));
    let private = quote!(#krate::__private);
    let name = tool_name(options, &sig.ident, &mut errors);
    let description = description(function, args_ty, &private, &mut errors);
    if let Some(errors) = errors {
        return Err(errors);
    }
    let arguments = match args_ty {
        Some(args_ty) => Arguments::given(args_ty),
        None => Arguments::generated(&roles, &krate, &private),
    };
    let (ctx_pattern, call) = call(sig, &roles, options.inline, &private);
    let result = result(&sig.output, call, &private);
    let declarations = declarations(options, &private);
    Ok(builder(
        function,
        &name,
        &Body {
            description,
            arguments,
            ctx_pattern,
            result,
            declarations,
        },
        &private,
    ))
}

/// Refuses what a tool function cannot be: generic, unsafe, variadic.
fn check_signature(sig: &syn::Signature, errors: &mut Option<syn::Error>) {
    if !sig.generics.params.is_empty() || sig.generics.where_clause.is_some() {
        push_error(
            errors,
            syn::Error::new_spanned(&sig.generics, "a tool function cannot be generic"),
        );
    }
    if let Some(unsafety) = &sig.unsafety {
        push_error(
            errors,
            syn::Error::new_spanned(unsafety, "a tool function cannot be unsafe"),
        );
    }
    if let Some(variadic) = &sig.variadic {
        push_error(
            errors,
            syn::Error::new_spanned(variadic, "a tool function cannot be variadic"),
        );
    }
}

/// The roles of the parameters that have one; the others' errors go to `errors`.
fn roles(params: Vec<Param>, errors: &mut Option<syn::Error>) -> Vec<Role> {
    let mut roles = Vec::new();
    for param in params {
        match param.role {
            Ok(role) => roles.push(role),
            Err(error) => push_error(errors, error),
        }
    }
    roles
}

/// The type of the `#[args]` parameter, if any. Refuses a second one, and plain arguments
/// beside it.
fn args_param<'a>(roles: &'a [Role], errors: &mut Option<syn::Error>) -> Option<&'a Type> {
    let args_params: Vec<&Type> = roles
        .iter()
        .filter_map(|role| match role {
            Role::Args { ty } => Some(ty),
            _ => None,
        })
        .collect();
    if args_params.len() > 1 {
        push_error(
            errors,
            syn::Error::new_spanned(args_params[1], "a tool has at most one `#[args]` parameter"),
        );
    }
    let args_ty = args_params.first().copied();
    if let Some(args_ty) = args_ty
        && let Some(Role::Field { name, .. }) =
            roles.iter().find(|role| matches!(role, Role::Field { .. }))
    {
        let mut error = syn::Error::new_spanned(
            name,
            "with an `#[args]` parameter, the other parameters can only be a ToolContext",
        );
        error.combine(syn::Error::new_spanned(args_ty, "the `#[args]` parameter"));
        push_error(errors, error);
    }
    args_ty
}

/// The tool's name: `name = "..."`, else the function's (checked against the name rule).
fn tool_name(options: &Options, fn_name: &Ident, errors: &mut Option<syn::Error>) -> LitStr {
    match &options.name {
        Some(name) => name.clone(),
        None => {
            let name = LitStr::new(&fn_name.unraw().to_string(), fn_name.span());
            if let Err(error) = check_name(&name.value(), fn_name.span()) {
                push_error(errors, error);
            }
            name
        }
    }
}

/// The expression of the tool's description: the function's doc comment, else the `#[args]`
/// type's schema description; a tool with neither is refused.
fn description(
    function: &ItemFn,
    args_ty: Option<&Type>,
    private: &TokenStream,
    errors: &mut Option<syn::Error>,
) -> TokenStream {
    let description = match doc_strings(&function.attrs) {
        Ok(docs) => collapse(&docs),
        Err(error) => {
            push_error(errors, error);
            String::new()
        }
    };
    if !description.is_empty() {
        quote!(::std::string::String::from(#description))
    } else if let Some(args_ty) = args_ty {
        quote! {
            #private::schema_description::<#args_ty>().unwrap_or_default()
        }
    } else {
        push_error(
            errors,
            syn::Error::new_spanned(
                &function.sig.ident,
                "a tool needs a description: add a doc comment to the function",
            ),
        );
        TokenStream::new()
    }
}

/// How the arguments object becomes the function's arguments.
struct Arguments {
    /// The type the arguments deserialize into.
    ty: TokenStream,
    /// The generated arguments struct (empty for an `#[args]` type).
    item: TokenStream,
    /// Per-field checks that name the field a deserialization error is about.
    field_checks: TokenStream,
    /// The statement binding the deserialized value to the call's arguments.
    bindings: TokenStream,
    /// A correction of the generated schema (empty when none is needed).
    schema_fixup: TokenStream,
}

impl Arguments {
    /// The `#[args]` parameter receives the whole object.
    fn given(args_ty: &Type) -> Arguments {
        Arguments {
            ty: quote!(#args_ty),
            item: TokenStream::new(),
            field_checks: TokenStream::new(),
            bindings: quote!(let __loom_args_value = __loom_args;),
            schema_fixup: TokenStream::new(),
        }
    }

    /// A struct with one field per plain parameter, deserialized without unknown fields.
    fn generated(roles: &[Role], krate: &Path, private: &TokenStream) -> Arguments {
        let serde_crate = format!("{}::__private::serde", path_string(krate));
        let schemars_crate = format!("{}::__private::schemars", path_string(krate));
        let args_struct = format_ident!("__LoomToolArgs");
        let mut fields = Vec::new();
        let mut checks = Vec::new();
        let mut patterns = Vec::new();
        for (index, role) in roles.iter().enumerate() {
            let Role::Field {
                name,
                ty,
                attrs,
                custom_serde,
            } = role
            else {
                continue;
            };
            let local = format_ident!("__loom_arg_{}", index);
            fields.push(quote! { #(#attrs)* #name: #ty });
            patterns.push(quote!(#name: #local));
            if !custom_serde {
                let key = name.unraw().to_string();
                checks.push(quote! {
                    if let ::core::option::Option::Some(__loom_value) = __loom_arguments.get(#key)
                        && let ::core::result::Result::Err(__loom_error) =
                            <#ty as #private::serde::Deserialize>::deserialize(__loom_value)
                    {
                        return ::std::format!("field `{}`: {}", #key, __loom_error);
                    }
                });
            }
        }
        let schema_fixup = if fields.is_empty() {
            // Schemars leaves `properties` out for an empty struct; some providers require it.
            quote! {
                if let #private::serde_json::Value::Object(__loom_map) = &mut __loom_schema {
                    __loom_map
                        .entry("properties")
                        .or_insert_with(|| #private::serde_json::Value::Object(::core::default::Default::default()));
                }
            }
        } else {
            TokenStream::new()
        };
        let item = quote! {
            #[derive(#private::serde::Deserialize, #private::schemars::JsonSchema)]
            #[serde(crate = #serde_crate, deny_unknown_fields)]
            #[schemars(crate = #schemars_crate)]
            #[allow(non_snake_case, non_camel_case_types)]
            struct #args_struct {
                #(#fields,)*
            }
        };
        Arguments {
            ty: quote!(#args_struct),
            item,
            field_checks: quote!(#(#checks)*),
            bindings: quote!(let #args_struct { #(#patterns,)* } = __loom_args;),
            schema_fixup,
        }
    }
}

/// The pattern binding the context (`_` when unused) and the call of the function: awaited
/// when async; when sync, on the blocking thread pool, or in place when it is `inline`.
fn call(
    sig: &syn::Signature,
    roles: &[Role],
    inline: bool,
    private: &TokenStream,
) -> (TokenStream, TokenStream) {
    let fn_name = &sig.ident;
    let mut uses_ctx = false;
    let call_args: Vec<TokenStream> = roles
        .iter()
        .enumerate()
        .map(|(index, role)| match role {
            Role::Context { by_ref: true } => {
                uses_ctx = true;
                quote!(&__loom_ctx)
            }
            Role::Context { by_ref: false } => {
                uses_ctx = true;
                quote!(::core::clone::Clone::clone(&__loom_ctx))
            }
            Role::Args { .. } => quote!(__loom_args_value),
            Role::Field { .. } => {
                let local = format_ident!("__loom_arg_{}", index);
                quote!(#local)
            }
        })
        .collect();
    let ctx_pattern = if uses_ctx {
        quote!(__loom_ctx)
    } else {
        quote!(_)
    };
    let call = if sig.asyncness.is_some() {
        quote!(#fn_name(#(#call_args),*).await)
    } else if inline {
        quote!(#fn_name(#(#call_args),*))
    } else {
        quote! {
            #private::run_blocking(move || #fn_name(#(#call_args),*)).await?
        }
    };
    (ctx_pattern, call)
}

/// The tool's result from the call: its value through `IntoToolOutput` (or `Json`), its error
/// as a `ToolError`.
fn result(output: &ReturnType, call: TokenStream, private: &TokenStream) -> TokenStream {
    let output = output_kind(output);
    let convert = |value: TokenStream| {
        if output.into_output {
            quote!(#private::IntoToolOutput::into_tool_output(#value))
        } else {
            quote!(#private::IntoToolOutput::into_tool_output(#private::Json(#value)))
        }
    };
    if output.fallible {
        let ok = convert(quote!(__loom_value));
        quote! {
            match #call {
                ::core::result::Result::Ok(__loom_value) => ::core::result::Result::Ok(#ok),
                ::core::result::Result::Err(__loom_error) => ::core::result::Result::Err(
                    #private::ToolError::from_display(__loom_error),
                ),
            }
        }
    } else {
        let ok = convert(call);
        quote!(::core::result::Result::Ok(#ok))
    }
}

/// The `ToolDeclarations` the options set (the others keep their default).
fn declarations(options: &Options, private: &TokenStream) -> TokenStream {
    let mut declarations = Vec::new();
    if let Some(variant) = &options.side_effects {
        declarations.push(quote!(side_effects: #private::SideEffects::#variant));
    }
    if let Some(variant) = &options.approval {
        declarations.push(quote!(approval: #private::Approval::#variant));
    }
    if let Some(idempotent) = options.idempotent {
        declarations.push(quote!(idempotent: #idempotent));
    }
    if let Some(variant) = &options.on_unknown {
        declarations.push(quote!(on_unknown: #private::OnUnknown::#variant));
    }
    if let Some(timeout) = &options.timeout {
        declarations.push(quote!(timeout: ::core::option::Option::Some(#timeout)));
    }
    if let Some(offload_over) = options.offload_over {
        declarations.push(quote!(offload_over: ::core::option::Option::Some(#offload_over)));
    }
    if let Some(template) = &options.business_key {
        declarations.push(quote!(
            business_key: ::core::option::Option::Some(#private::BusinessKey::template(#template))
        ));
    }
    if declarations.is_empty() {
        quote!(::core::default::Default::default())
    } else {
        quote! {
            #private::ToolDeclarations {
                #(#declarations,)*
                ..::core::default::Default::default()
            }
        }
    }
}

/// The parts of the builder's body decided above.
struct Body {
    description: TokenStream,
    arguments: Arguments,
    ctx_pattern: TokenStream,
    result: TokenStream,
    declarations: TokenStream,
}

/// The `<name>_tool()` builder: parses the arguments, builds the spec, runs the function.
fn builder(function: &ItemFn, name: &LitStr, body: &Body, private: &TokenStream) -> TokenStream {
    let Body {
        description,
        arguments,
        ctx_pattern,
        result,
        declarations,
    } = body;
    let Arguments {
        ty: args_ty,
        item: args_item,
        field_checks,
        bindings,
        schema_fixup,
    } = arguments;
    let fn_name = &function.sig.ident;
    let vis = &function.vis;
    let builder = format_ident!("{}_tool", fn_name.unraw(), span = fn_name.span());
    let builder_doc = format!(
        "Builds the `{}` tool from the function `{}` (generated by `#[tool]`).",
        name.value(),
        fn_name.unraw()
    );
    quote! {
        #[doc = #builder_doc]
        #[must_use]
        #vis fn #builder() -> #private::FnTool {
            #args_item

            fn __loom_parse(
                __loom_arguments: #private::serde_json::Value,
            ) -> ::core::result::Result<#args_ty, #private::ToolError> {
                fn __loom_field_error(__loom_arguments: &#private::serde_json::Value) -> ::std::string::String {
                    #field_checks
                    ::std::string::String::new()
                }
                let __loom_arguments = match __loom_arguments {
                    #private::serde_json::Value::Null => {
                        #private::serde_json::Value::Object(::core::default::Default::default())
                    }
                    __loom_other => __loom_other,
                };
                if !__loom_arguments.is_object() {
                    return ::core::result::Result::Err(#private::ToolError::new(::std::format!(
                        "invalid arguments: expected a JSON object, got {}",
                        __loom_arguments
                    )));
                }
                match <#args_ty as #private::serde::Deserialize>::deserialize(&__loom_arguments) {
                    ::core::result::Result::Ok(__loom_args) => ::core::result::Result::Ok(__loom_args),
                    ::core::result::Result::Err(__loom_error) => {
                        let __loom_message = __loom_error.to_string();
                        let __loom_message = if __loom_message.contains("field `") {
                            __loom_message
                        } else {
                            let __loom_field = __loom_field_error(&__loom_arguments);
                            if __loom_field.is_empty() { __loom_message } else { __loom_field }
                        };
                        ::core::result::Result::Err(#private::ToolError::new(::std::format!(
                            "invalid arguments: {}",
                            __loom_message
                        )))
                    }
                }
            }

            // Kept even when every field is set, so new declarations get their default.
            #[allow(clippy::needless_update)]
            let __loom_declarations: #private::ToolDeclarations = #declarations;
            #[allow(unused_mut)]
            let mut __loom_schema = #private::schema_for::<#args_ty>();
            #schema_fixup
            let __loom_spec = #private::ToolSpec {
                name: ::std::string::String::from(#name),
                description: #description,
                input_schema: __loom_schema,
                kind: #private::ToolKind::Python,
                declarations: __loom_declarations,
            };
            async fn __loom_run(
                #ctx_pattern: #private::ToolContext,
                __loom_arguments: #private::serde_json::Value,
            ) -> ::core::result::Result<#private::ToolOutput, #private::ToolError> {
                let __loom_args = __loom_parse(__loom_arguments)?;
                #bindings
                #result
            }

            #private::FnTool::new(__loom_spec, |__loom_ctx, __loom_arguments| {
                ::std::boxed::Box::pin(__loom_run(__loom_ctx, __loom_arguments))
            })
        }
    }
}

/// A path as a string for `#[serde(crate = "...")]`.
fn path_string(path: &Path) -> String {
    quote!(#path).to_string().replace(' ', "")
}

#[cfg(test)]
mod tests {
    use quote::quote;

    use super::tool;

    /// A documented sync tool function.
    fn sync_function() -> proc_macro2::TokenStream {
        quote!(
            /// Says nothing.
            fn f() -> String {
                String::new()
            }
        )
    }

    /// The compile errors of an expansion, as text.
    fn errors(attr: proc_macro2::TokenStream, item: proc_macro2::TokenStream) -> String {
        let expanded = tool(attr, item).to_string();
        expanded
            .split("compile_error")
            .skip(1)
            .collect::<Vec<_>>()
            .join("|")
    }

    #[test]
    fn inline_is_refused_on_an_async_function_and_is_a_flag() {
        let asynchronous = quote!(
            /// Says nothing.
            async fn f() -> String {
                String::new()
            }
        );
        let refusals = [
            (
                quote!(inline),
                asynchronous,
                "`inline` is for a sync function",
            ),
            (
                quote!(inline = 1),
                sync_function(),
                "expected `inline = true` or `false`",
            ),
            (
                quote!(inlined),
                sync_function(),
                "idempotent, inline, on_unknown",
            ),
            (
                quote!(inline, timeout = 2),
                sync_function(),
                "`inline` and `timeout` together",
            ),
        ];
        for (attr, item, expected) in refusals {
            let refused = errors(attr, item);
            assert!(refused.contains(expected), "{expected}: {refused}");
        }
        assert_eq!(errors(quote!(inline), sync_function()), "");
    }

    #[test]
    fn an_inline_function_is_called_in_place() {
        let item = sync_function();
        assert!(
            tool(quote!(), item.clone())
                .to_string()
                .contains("run_blocking")
        );
        let inline = tool(quote!(inline), item.clone()).to_string();
        assert!(!inline.contains("run_blocking"), "{inline}");
        let off = tool(quote!(inline = false), item).to_string();
        assert!(off.contains("run_blocking"), "{off}");
    }
}
