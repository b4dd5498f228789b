//! The `#[tool]` attribute: a plain Rust function becomes a Loom tool.
//!
//! Use it through the facade (`#[loom_ia::tool]`); see [`macro@tool`].

mod description;
mod expand;
mod options;

use proc_macro::TokenStream;

/// Turns a plain function (sync or async) into a Loom tool.
///
/// The function is kept as written (minus the helper attributes the macro consumes) and a
/// sibling function `<name>_tool() -> loom_ia::FnTool`, with the same visibility, builds the tool.
///
/// ```ignore
/// /// Calcule le prix TTC à partir d'un montant HT et d'un taux de TVA en pourcentage.
/// #[loom_ia::tool(side_effects = "none", idempotent)]
/// fn prix_ttc(montant_ht: f64, taux_tva: f64) -> Result<String, PrixError> {
///     /* ... */
/// }
///
/// let tool = prix_ttc_tool();
/// ```
///
/// - **Name**: the function's name, or `name = "..."` (`^[A-Za-z0-9_-]{1,64}$`).
/// - **Description**: the function's doc comment (paragraphs separated by a blank line; the
///   lines of a paragraph joined by a space). Without one, the description of the `#[args]`
///   struct's doc comment.
/// - **Arguments**: each parameter becomes a property of the input schema (`Option<T>` ones are
///   optional; doc comments, `#[serde(..)]` and `#[schemars(..)]` attributes on a parameter are
///   moved onto that property). A parameter whose type is `ToolContext` (or `&ToolContext`) is
///   injected instead. A parameter marked `#[args]` receives the whole arguments object, its type
///   implementing `serde::Deserialize` and `schemars::JsonSchema`.
/// - **Result**: `T` or `Result<T, E>` with `E: Display`. `String`, `&str`, `()`, `ToolOutput`,
///   `Value`, `Json<_>`, `Views<_, _>` (a compact view for the model and a full payload for
///   interfaces), `Image` and `ToolFile` (a file stored as an artifact and journaled by its
///   `artifact://` URI) and `impl IntoToolOutput` convert through `IntoToolOutput`; any other
///   `T` is serialized as a structured result (a JSON block and `data`).
/// - **Options**: `name = "..."`, `side_effects = "none" | "reversible" | "irreversible"`,
///   `approval = "never" | "always" | "policy"`, `idempotent` (or `idempotent = true|false`),
///   `on_unknown = "error" | "pause"`, `timeout = <seconds>` (integer or float),
///   `offload_over = <characters>`, `business_key = "relance:{numero}"` (a template over
///   argument names: `{name}` is the argument's string or number value; a missing argument
///   gives no key), `inline` (or `inline = true|false`, see below), `crate = <path>` (default
///   `::loom_ia`).
/// - **Where it runs**: each call has a task of its own, on which an async function is awaited.
///   A sync function runs on tokio's blocking thread pool (`spawn_blocking`), so that one that
///   blocks (file or network I/O, a long computation) never holds up the other runs; that costs
///   two thread hand-offs per call. A sync function that only computes and returns within
///   microseconds (arithmetic, formatting) can say `inline`: it is then called in place, on the
///   call's task. An `inline` function that blocked would stall every run of its thread, and no
///   timeout could interrupt it: `inline` is refused on an `async fn` and with `timeout`.
#[proc_macro_attribute]
pub fn tool(attr: TokenStream, item: TokenStream) -> TokenStream {
    expand::tool(attr.into(), item.into()).into()
}
