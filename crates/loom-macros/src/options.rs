//! The options of `#[tool(...)]`.

use proc_macro2::{Literal, Span, TokenStream};
use quote::{ToTokens, quote};
use syn::{Ident, Lit, LitBool, LitStr, Path, Token, meta::ParseNestedMeta, parse::Parser};

/// The parsed options. Enum-valued options hold the variant to use.
#[derive(Default)]
pub(crate) struct Options {
    pub(crate) name: Option<LitStr>,
    pub(crate) side_effects: Option<Ident>,
    pub(crate) approval: Option<Ident>,
    pub(crate) idempotent: Option<bool>,
    pub(crate) on_unknown: Option<Ident>,
    /// An expression of type `Duration`.
    pub(crate) timeout: Option<TokenStream>,
    pub(crate) offload_over: Option<u64>,
    /// The business-key template (`"relance:{numero}"`).
    pub(crate) business_key: Option<LitStr>,
    /// A sync function run on the calling task rather than on the blocking thread pool.
    pub(crate) inline: bool,
    pub(crate) krate: Option<Path>,
}

impl Options {
    /// Parses the attribute's arguments.
    pub(crate) fn parse(attr: TokenStream) -> syn::Result<Options> {
        let mut options = Options::default();
        let mut seen: Vec<String> = Vec::new();
        let parser = syn::meta::parser(|meta| {
            let key = meta
                .path
                .get_ident()
                .map(ToString::to_string)
                .unwrap_or_default();
            if seen.contains(&key) {
                return Err(meta.error(format_args!("duplicate option `{key}`")));
            }
            options.parse_one(&key, &meta)?;
            seen.push(key);
            Ok(())
        });
        parser.parse2(attr)?;
        Ok(options)
    }

    fn parse_one(&mut self, key: &str, meta: &ParseNestedMeta<'_>) -> syn::Result<()> {
        match key {
            "name" => {
                let name: LitStr = meta.value()?.parse()?;
                check_name(&name.value(), name.span())?;
                self.name = Some(name);
            }
            "side_effects" => {
                self.side_effects = Some(enum_value(
                    meta,
                    &[
                        ("none", "None"),
                        ("reversible", "Reversible"),
                        ("irreversible", "Irreversible"),
                    ],
                )?);
            }
            "approval" => {
                self.approval = Some(enum_value(
                    meta,
                    &[
                        ("never", "Never"),
                        ("always", "Always"),
                        ("policy", "Policy"),
                    ],
                )?);
            }
            "on_unknown" => {
                self.on_unknown =
                    Some(enum_value(meta, &[("error", "Error"), ("pause", "Pause")])?);
            }
            "idempotent" => self.idempotent = Some(flag(meta, "idempotent")?),
            "inline" => self.inline = flag(meta, "inline")?,
            "timeout" => self.timeout = Some(timeout(meta)?),
            "offload_over" => {
                let lit: Lit = meta.value()?.parse()?;
                let Lit::Int(int) = &lit else {
                    return Err(syn::Error::new(
                        lit.span(),
                        "expected a number of characters (`offload_over = 4000`)",
                    ));
                };
                self.offload_over = Some(int.base10_parse::<u64>()?);
            }
            "business_key" => {
                let template: LitStr = meta.value()?.parse()?;
                check_template(&template)?;
                self.business_key = Some(template);
            }
            "crate" => {
                let input = meta.value()?;
                let path = if input.peek(LitStr) {
                    input.parse::<LitStr>()?.parse::<Path>()?
                } else {
                    Path::parse_mod_style(input)?
                };
                self.krate = Some(path);
            }
            _ => {
                return Err(meta.error(format_args!(
                    "unknown option `{}`; expected one of: name, side_effects, approval, \
                     idempotent, inline, on_unknown, timeout, offload_over, business_key, crate",
                    meta.path.to_token_stream().to_string().replace(' ', "")
                )));
            }
        }
        Ok(())
    }
}

/// A flag: `key` alone (true) or `key = true|false`.
fn flag(meta: &ParseNestedMeta<'_>, key: &str) -> syn::Result<bool> {
    if !meta.input.peek(Token![=]) {
        return Ok(true);
    }
    let value: LitBool = meta.value()?.parse().map_err(|error| {
        syn::Error::new(error.span(), format!("expected `{key} = true` or `false`"))
    })?;
    Ok(value.value)
}

/// Checks a business-key template: balanced `{name}` placeholders, at least one.
fn check_template(template: &LitStr) -> syn::Result<()> {
    let text = template.value();
    let mut chars = text.chars().peekable();
    let mut placeholders = 0;
    let error = |message: &str| {
        Err(syn::Error::new(
            template.span(),
            format!("invalid business key template \"{text}\": {message}"),
        ))
    };
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
            }
            '{' => {
                let mut name = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => name.push(c),
                        None => return error("unclosed `{`"),
                    }
                }
                if name.trim().is_empty() {
                    return error("empty `{}` placeholder");
                }
                placeholders += 1;
            }
            '}' => return error("unmatched `}` (write `}}` for a literal brace)"),
            _ => {}
        }
    }
    if placeholders == 0 {
        return error("it names no argument (`\"relance:{numero}\"`)");
    }
    Ok(())
}

/// Checks a tool name against `^[A-Za-z0-9_-]{1,64}$`.
pub(crate) fn check_name(name: &str, span: Span) -> syn::Result<()> {
    let valid = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(())
    } else {
        Err(syn::Error::new(
            span,
            format!(
                "invalid tool name `{name}`: a tool name must match ^[A-Za-z0-9_-]{{1,64}}$ \
                 (set one with `#[tool(name = \"...\")]`)"
            ),
        ))
    }
}

/// Parses `= "value"` (or `= value`) into the variant named for it in `choices`.
fn enum_value(meta: &ParseNestedMeta<'_>, choices: &[(&str, &str)]) -> syn::Result<Ident> {
    let input = meta.value()?;
    let (value, span) = if input.peek(LitStr) {
        let lit: LitStr = input.parse()?;
        (lit.value(), lit.span())
    } else if input.peek(Ident) {
        let ident: Ident = input.parse()?;
        (ident.to_string(), ident.span())
    } else {
        return Err(input.error("expected a string"));
    };
    match choices.iter().find(|(name, _)| *name == value) {
        Some((_, variant)) => Ok(Ident::new(variant, span)),
        None => {
            let expected: Vec<String> = choices
                .iter()
                .map(|(name, _)| format!("\"{name}\""))
                .collect();
            let key = meta.path.to_token_stream().to_string();
            Err(syn::Error::new(
                span,
                format!(
                    "invalid value \"{value}\" for `{key}`; expected one of: {}",
                    expected.join(", ")
                ),
            ))
        }
    }
}

/// Parses `= <seconds>` (integer or float) into a `Duration` expression.
fn timeout(meta: &ParseNestedMeta<'_>) -> syn::Result<TokenStream> {
    let lit: Lit = meta.value()?.parse()?;
    let nanos: u128 = match &lit {
        Lit::Int(int) => u128::from(int.base10_parse::<u64>()?) * 1_000_000_000,
        Lit::Float(float) => {
            let seconds = float.base10_parse::<f64>()?;
            if !seconds.is_finite() || !(0.0..=1.0e10).contains(&seconds) {
                return Err(syn::Error::new(
                    lit.span(),
                    "timeout out of range: expected a number of seconds",
                ));
            }
            // In range: at most 1e19 nanoseconds, below u64::MAX.
            (seconds * 1.0e9).round() as u128
        }
        _ => {
            return Err(syn::Error::new(
                lit.span(),
                "expected a number of seconds (`timeout = 10` or `timeout = 2.5`)",
            ));
        }
    };
    if nanos == 0 {
        return Err(syn::Error::new(lit.span(), "the timeout must be positive"));
    }
    if nanos.is_multiple_of(1_000_000_000) {
        let secs = Literal::u64_unsuffixed(
            u64::try_from(nanos / 1_000_000_000)
                .map_err(|_| syn::Error::new(lit.span(), "timeout out of range"))?,
        );
        Ok(quote!(::core::time::Duration::from_secs(#secs)))
    } else {
        let nanos = Literal::u64_unsuffixed(
            u64::try_from(nanos)
                .map_err(|_| syn::Error::new(lit.span(), "timeout out of range"))?,
        );
        Ok(quote!(::core::time::Duration::from_nanos(#nanos)))
    }
}
