//! The `#[tool]` attribute.
use proc_macro::TokenStream;

/// Turns a function into a Loom tool.
#[proc_macro_attribute]
pub fn tool(_attr: TokenStream, item: TokenStream) -> TokenStream {
    item
}
