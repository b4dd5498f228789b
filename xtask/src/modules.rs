//! The module graph of a crate, read from its sources, and the checks on the
//! engine's: no module names the dispatcher (`driver`), and the modules form
//! no import circle.
//!
//! A module is a top-level module of the crate (`src/tools.rs`,
//! `src/tools/mod.rs` and `src/tools/*.rs` are all `tools`). It references
//! another when its code names a path through the crate root
//! (`use crate::{a, b::c}`, `crate::a::f()`, `super::a` from a top-level
//! module). A name the crate root re-exports (`crate::Engine`) counts as a
//! reference to the module that defines it. The crate root (`lib.rs`) only
//! declares modules and re-exports their items: a module naming an item
//! defined in `lib.rs` itself is a violation, since the root re-exports from
//! every module and would close a circle through it. Comments, strings and
//! references inside a module to itself are ignored.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

use crate::workspace::Error;

/// The engine's sources, relative to the workspace root.
pub const ENGINE_SRC: &str = "crates/loom-engine/src";

/// The engine's dispatcher: the module that drives the loop over the points,
/// which no other module may name.
pub const ENGINE_DISPATCHER: &str = "driver";

/// Where a reference was seen, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    /// What it names below the crate root (`driver`, `Engine`).
    pub name: String,
    /// The file, relative to the crate's `src`.
    pub file: String,
    /// The path as written (`crate::driver::Driver`).
    pub path: String,
}

/// The references between the top-level modules of one crate.
#[derive(Debug, Default)]
pub struct Graph {
    /// Every top-level module, with the modules it references and where the
    /// first reference to each was seen.
    pub edges: BTreeMap<String, BTreeMap<String, Seen>>,
    /// References that do not resolve to a module: items defined in the
    /// crate root, or names the root does not re-export.
    pub unresolved: Vec<(String, Seen)>,
}

impl Graph {
    /// Reads the crate whose sources are in `src` (its `lib.rs` and modules).
    pub fn load(src: &Path) -> Result<Graph, Error> {
        let mut files = Vec::new();
        collect(src, &mut files)?;
        files.sort();
        let mut sources = Vec::new();
        for file in files {
            let text = fs::read_to_string(&file)
                .map_err(|e| Error::new(format!("cannot read {}: {e}", file.display())))?;
            let relative = file.strip_prefix(src).unwrap_or(&file).to_path_buf();
            sources.push((relative, text));
        }
        Ok(Graph::from_sources(&sources))
    }

    /// The graph of a crate given as `(path relative to src, source)` pairs.
    pub fn from_sources(sources: &[(PathBuf, String)]) -> Graph {
        let root = sources
            .iter()
            .find(|(path, _)| path == Path::new("lib.rs"))
            .map(|(_, text)| Root::read(&strip(text)))
            .unwrap_or_default();
        let mut graph = Graph::default();
        for (path, text) in sources {
            let Some(module) = module_path(path) else {
                continue;
            };
            let Some(top) = module.first().cloned() else {
                // The crate root declares and re-exports: its own references are its job.
                continue;
            };
            graph.edges.entry(top.clone()).or_default();
            let file = path.display().to_string();
            for (target, written) in references(&strip(text), &module) {
                let seen = Seen {
                    name: target.clone(),
                    file: file.clone(),
                    path: written,
                };
                let resolved = if root.modules.contains(&target) {
                    Some(target.clone())
                } else {
                    root.exports.get(&target).cloned()
                };
                match resolved {
                    Some(to) if to == top => {}
                    Some(to) => {
                        graph
                            .edges
                            .entry(top.clone())
                            .or_default()
                            .entry(to)
                            .or_insert(seen);
                    }
                    None => {
                        let known = graph
                            .unresolved
                            .iter()
                            .any(|(from, other)| *from == top && other.name == seen.name);
                        if !known {
                            graph.unresolved.push((top.clone(), seen));
                        }
                    }
                }
            }
        }
        graph
    }

    /// The modules that reference `module`, with where.
    pub fn users_of(&self, module: &str) -> Vec<(&str, &Seen)> {
        self.edges
            .iter()
            .filter_map(|(from, to)| to.get(module).map(|seen| (from.as_str(), seen)))
            .collect()
    }

    /// Every group of modules that import each other in a circle (a strongly
    /// connected group of more than one module, sorted), with one circle in
    /// it as an example (the modules along it, the first repeated at the end).
    pub fn circles(&self) -> Vec<(Vec<String>, Vec<String>)> {
        self.groups()
            .into_iter()
            .filter(|group| group.len() > 1)
            .filter_map(|group| {
                let circle = self.circle_in(&group)?;
                Some((group, circle))
            })
            .collect()
    }

    /// Strongly connected groups of modules (Tarjan), each sorted.
    fn groups(&self) -> Vec<Vec<String>> {
        struct Walk<'g> {
            graph: &'g Graph,
            index: BTreeMap<&'g str, usize>,
            low: BTreeMap<&'g str, usize>,
            stack: Vec<&'g str>,
            on_stack: BTreeSet<&'g str>,
            groups: Vec<Vec<String>>,
        }
        impl<'g> Walk<'g> {
            fn visit(&mut self, node: &'g str) {
                let n = self.index.len();
                self.index.insert(node, n);
                self.low.insert(node, n);
                self.stack.push(node);
                self.on_stack.insert(node);
                let graph = self.graph;
                for next in graph.edges.get(node).into_iter().flat_map(|to| to.keys()) {
                    let next = next.as_str();
                    if !self.index.contains_key(next) {
                        self.visit(next);
                        let low = self.low[node].min(self.low[next]);
                        self.low.insert(node, low);
                    } else if self.on_stack.contains(next) {
                        let low = self.low[node].min(self.index[next]);
                        self.low.insert(node, low);
                    }
                }
                if self.low[node] == self.index[node] {
                    let mut group = Vec::new();
                    while let Some(member) = self.stack.pop() {
                        self.on_stack.remove(member);
                        group.push(member.to_owned());
                        if member == node {
                            break;
                        }
                    }
                    group.sort();
                    self.groups.push(group);
                }
            }
        }
        let mut walk = Walk {
            graph: self,
            index: BTreeMap::new(),
            low: BTreeMap::new(),
            stack: Vec::new(),
            on_stack: BTreeSet::new(),
            groups: Vec::new(),
        };
        for node in self.edges.keys() {
            if !walk.index.contains_key(node.as_str()) {
                walk.visit(node);
            }
        }
        walk.groups.sort();
        walk.groups
    }

    /// One circle through the first module of `group` (breadth first, so the
    /// shortest).
    fn circle_in(&self, group: &[String]) -> Option<Vec<String>> {
        let start = group.first()?;
        let members: BTreeSet<&str> = group.iter().map(String::as_str).collect();
        let mut came_from: BTreeMap<&str, &str> = BTreeMap::new();
        let mut queue = std::collections::VecDeque::from([start.as_str()]);
        while let Some(node) = queue.pop_front() {
            for next in self.edges.get(node).into_iter().flat_map(|to| to.keys()) {
                let next = next.as_str();
                if !members.contains(next) {
                    continue;
                }
                if next == start {
                    let mut path = vec![start.clone()];
                    let mut at = node;
                    let mut back = vec![node.to_owned()];
                    while let Some(prev) = came_from.get(at) {
                        back.push((*prev).to_owned());
                        at = prev;
                    }
                    back.pop();
                    back.reverse();
                    path.extend(back);
                    path.push(start.clone());
                    return Some(path);
                }
                if next != start && !came_from.contains_key(next) {
                    came_from.insert(next, node);
                    queue.push_back(next);
                }
            }
        }
        None
    }
}

/// Checks the module graph of the crate in `src`: no module but the crate
/// root names `dispatcher`, every reference resolves to a module, and no
/// circle. Returns one message per violation.
pub fn check_graph(crate_name: &str, graph: &Graph, dispatcher: &str) -> Vec<String> {
    let mut violations = Vec::new();
    for (from, seen) in graph.users_of(dispatcher) {
        violations.push(format!(
            "{crate_name}: module {from} names the dispatcher {dispatcher} ({} in {}): the \
             loop's points receive the context they need, and only the crate root re-exports \
             from {dispatcher}",
            seen.path, seen.file
        ));
    }
    for (from, seen) in &graph.unresolved {
        violations.push(format!(
            "{crate_name}: module {from} names crate::{} ({} in {}), which is no module nor \
             an item the crate root re-exports from one: define it in a module (lib.rs only \
             declares modules and re-exports)",
            seen.name, seen.path, seen.file
        ));
    }
    for (group, circle) in graph.circles() {
        let witnesses: Vec<String> = circle
            .windows(2)
            .filter_map(|pair| {
                let seen = graph.edges.get(&pair[0])?.get(&pair[1])?;
                Some(format!("{} in {}", seen.path, seen.file))
            })
            .collect();
        violations.push(format!(
            "{crate_name}: modules {} import each other in a circle, such as {} ({})",
            group.join(", "),
            circle.join(" → "),
            witnesses.join("; ")
        ));
    }
    violations
}

/// The engine's module checks, on the workspace at `root`.
pub fn check_engine(root: &Path) -> Result<Vec<String>, Error> {
    let graph = Graph::load(&root.join(ENGINE_SRC))?;
    if graph.edges.is_empty() {
        return Err(Error::new(format!(
            "no module found under {ENGINE_SRC}: the check would pass vacuously"
        )));
    }
    Ok(check_graph("loom-engine", &graph, ENGINE_DISPATCHER))
}

/// What the crate root declares: its modules, and which module each
/// re-exported name comes from.
#[derive(Debug, Default)]
struct Root {
    modules: BTreeSet<String>,
    exports: BTreeMap<String, String>,
}

impl Root {
    /// Reads `mod x;` declarations and `use x::{A, B as C};` re-exports from
    /// the stripped code of `lib.rs`.
    fn read(code: &str) -> Root {
        let mut root = Root::default();
        let tokens = tokens(code);
        let mut i = 0;
        while i < tokens.len() {
            match tokens[i].as_str() {
                "mod" => {
                    if let (Some(name), Some(end)) = (tokens.get(i + 1), tokens.get(i + 2))
                        && end == ";"
                    {
                        root.modules.insert(name.clone());
                    }
                    i += 1;
                }
                "use" => {
                    let end = tokens[i..]
                        .iter()
                        .position(|t| t == ";")
                        .map_or(tokens.len(), |p| i + p);
                    root.read_use(&tokens[i + 1..end]);
                    i = end;
                }
                _ => i += 1,
            }
        }
        root
    }

    /// One `use` tree of the root: names brought in from a module.
    fn read_use(&mut self, tree: &[String]) {
        let tree = match tree.first().map(String::as_str) {
            Some("crate" | "self") => tree.get(2..).unwrap_or_default(),
            _ => tree,
        };
        let Some(module) = tree.first() else {
            return;
        };
        for name in leaf_names(tree.get(1..).unwrap_or_default()) {
            self.exports.insert(name, module.clone());
        }
    }
}

/// The names a use tree brings in (after the first segment): the last
/// segment of each leaf, or its `as` alias.
fn leaf_names(tree: &[String]) -> Vec<String> {
    let mut names = Vec::new();
    // The last identifier of the current leaf: its last segment, or its alias.
    let mut last: Option<&String> = None;
    for token in tree {
        match token.as_str() {
            "::" | "{" | "as" => {}
            "," | "}" => names.extend(last.take().cloned()),
            _ => last = Some(token),
        }
    }
    names.extend(last.take().cloned());
    names.retain(|name| name != "self" && name != "*");
    names
}

/// The module path of a source file relative to `src` (`[]` for `lib.rs`),
/// or `None` for a file that is not a module (`main.rs`, `bin/`).
fn module_path(path: &Path) -> Option<Vec<String>> {
    let mut parts: Vec<String> = path
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let file = parts.pop()?;
    let stem = file.strip_suffix(".rs")?;
    if parts.first().is_some_and(|p| p == "bin") || (parts.is_empty() && stem == "main") {
        return None;
    }
    if !(parts.is_empty() && stem == "lib") && stem != "mod" {
        parts.push(stem.to_owned());
    }
    Some(parts)
}

/// Every crate-level reference in `code` (stripped), made from the module at
/// `module`: the first segment below the crate root, and the path as written.
fn references(code: &str, module: &[String]) -> Vec<(String, String)> {
    let tokens = tokens(code);
    let mut found = Vec::new();
    // Inline modules (`mod tests { … }`) open at a brace depth: `super` inside
    // one is the file's module.
    let mut inline: Vec<usize> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < tokens.len() {
        let token = tokens[i].as_str();
        match token {
            "{" => depth += 1,
            "}" => {
                depth = depth.saturating_sub(1);
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
            }
            "mod" if tokens.get(i + 2).is_some_and(|t| t == "{") => {
                inline.push(depth);
            }
            _ => {}
        }
        let starts_path = matches!(token, "crate" | "super")
            && tokens.get(i + 1).is_some_and(|t| t == "::")
            && !(i > 0 && (tokens[i - 1] == "$" || tokens[i - 1] == "::"));
        if !starts_path {
            i += 1;
            continue;
        }
        // Where the path starts: the crate root, or an ancestor of this module.
        let mut here: Vec<String> = module.to_vec();
        here.extend(inline.iter().map(|_| String::from("<inline>")));
        let mut j = i;
        let mut at_root = false;
        while j < tokens.len() {
            match tokens[j].as_str() {
                "crate" => {
                    here.clear();
                    at_root = true;
                }
                "super" => {
                    here.pop();
                    at_root = here.is_empty();
                }
                _ => break,
            }
            if tokens.get(j + 1).is_some_and(|t| t == "::") {
                j += 2;
            } else {
                break;
            }
        }
        let written_end = path_end(&tokens, j);
        let written = tokens[i..written_end].concat();
        if at_root {
            for first in first_segments(&tokens[j..written_end]) {
                found.push((first, written.clone()));
            }
        }
        i = written_end.max(i + 1);
    }
    found
}

/// Where a path (or use tree) starting at `start` ends: identifiers joined by
/// `::`, possibly ending in a braced group.
fn path_end(tokens: &[String], start: usize) -> usize {
    let mut j = start;
    loop {
        match tokens.get(j).map(String::as_str) {
            Some("{") => {
                let mut depth = 0usize;
                while let Some(token) = tokens.get(j) {
                    j += 1;
                    match token.as_str() {
                        "{" => depth += 1,
                        "}" => {
                            depth -= 1;
                            if depth == 0 {
                                return j;
                            }
                        }
                        _ => {}
                    }
                }
                return j;
            }
            Some(token) if is_ident(token) => {
                j += 1;
                if tokens.get(j).is_some_and(|t| t == "::") {
                    j += 1;
                } else {
                    return j;
                }
            }
            _ => return j,
        }
    }
}

/// The first segment of each path a (stripped, tokenized) path or use tree
/// names: `a::b` → `a`; `{a, b::{c}}` → `a`, `b`.
fn first_segments(tree: &[String]) -> Vec<String> {
    let Some(first) = tree.first() else {
        return Vec::new();
    };
    if first != "{" {
        return if is_ident(first) {
            vec![first.clone()]
        } else {
            Vec::new()
        };
    }
    let mut segments = Vec::new();
    let mut depth = 0usize;
    let mut expect = true;
    for token in tree {
        match token.as_str() {
            "{" => {
                depth += 1;
                expect = depth == 1;
            }
            "}" => depth = depth.saturating_sub(1),
            "," if depth == 1 => expect = true,
            name if depth == 1 && expect && is_ident(name) => {
                if name != "self" {
                    segments.push(name.to_owned());
                }
                expect = false;
            }
            _ => {}
        }
    }
    segments
}

fn is_ident(token: &str) -> bool {
    token
        .chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c == '_')
        && token.chars().all(|c| c.is_alphanumeric() || c == '_')
}

/// Identifiers, `::`, and single punctuation characters.
fn tokens(code: &str) -> Vec<String> {
    let chars: Vec<char> = code.chars().collect();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c.is_alphanumeric() || c == '_' {
            let start = i;
            while i < chars.len() && (chars[i].is_alphanumeric() || chars[i] == '_') {
                i += 1;
            }
            tokens.push(chars[start..i].iter().collect());
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            tokens.push("::".to_owned());
            i += 2;
        } else {
            tokens.push(c.to_string());
            i += 1;
        }
    }
    tokens
}

/// `code` without comments, and with the contents of string and character
/// literals removed (their quotes kept).
pub fn strip(code: &str) -> String {
    let chars: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0usize;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if c == 'r'
            && !chars
                .get(i.wrapping_sub(1))
                .is_some_and(|p| i > 0 && (p.is_alphanumeric() || *p == '_'))
            && matches!(next, Some('"' | '#'))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    Some(_) => j += 1,
                }
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{..}'), or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                i = j + 1;
                out.push_str("''");
            } else if chars.get(i + 2) == Some(&'\'') {
                i += 3;
                out.push_str("''");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), Error> {
    let entries =
        fs::read_dir(dir).map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::new(format!("cannot list {}: {e}", dir.display())))?;
        let path = entry.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(files: &[(&str, &str)]) -> Graph {
        let sources: Vec<(PathBuf, String)> = files
            .iter()
            .map(|(path, text)| (PathBuf::from(path), (*text).to_owned()))
            .collect();
        Graph::from_sources(&sources)
    }

    const LIB: &str = "//! Root.\nmod driver;\nmod tools;\nmod writer;\npub mod roles;\n\
        pub use driver::Observer;\npub use writer::{Writer, Stamp as Stamped};\n";

    #[test]
    fn a_layered_crate_passes() {
        let g = graph(&[
            ("lib.rs", LIB),
            (
                "driver.rs",
                "use crate::{tools, writer::Writer};\nfn f() { crate::roles::x(); }",
            ),
            ("tools.rs", "use crate::Writer;\n"),
            (
                "roles.rs",
                "use crate::Stamped;\n// crate::driver in a comment\nconst S: &str = \"crate::driver::X\";",
            ),
            (
                "writer.rs",
                "//! Leaf.\n#[cfg(test)]\nmod tests { use super::*; fn g() { super::h(); } }",
            ),
        ]);
        assert_eq!(check_graph("k", &g, "driver"), Vec::<String>::new());
        let edges: Vec<(&str, Vec<&str>)> = g
            .edges
            .iter()
            .map(|(from, to)| (from.as_str(), to.keys().map(String::as_str).collect()))
            .collect();
        assert_eq!(
            edges,
            [
                ("driver", vec!["roles", "tools", "writer"]),
                ("roles", vec!["writer"]),
                ("tools", vec!["writer"]),
                ("writer", vec![]),
            ]
        );
    }

    #[test]
    fn naming_the_dispatcher_fails_directly_or_through_a_re_export() {
        let g = graph(&[
            ("lib.rs", LIB),
            ("driver.rs", "use crate::tools;\n"),
            (
                "tools.rs",
                "use crate::{writer::{self, Writer}, driver::{Driver, StepEnd}};\n",
            ),
            ("roles.rs", "fn f(o: &dyn crate::Observer) {}\n"),
            ("writer.rs", ""),
        ]);
        let violations = check_graph("k", &g, "driver");
        assert_eq!(violations.len(), 3, "{violations:#?}");
        assert!(violations[0].starts_with(
            "k: module roles names the dispatcher driver (crate::Observer in roles.rs)"
        ));
        assert!(violations[1].starts_with("k: module tools names the dispatcher driver (crate::{writer::{self,Writer},driver::{Driver,StepEnd}} in tools.rs)"));
        assert!(violations[2].starts_with("k: modules driver, tools import each other in a circle, such as driver → tools → driver"));
    }

    #[test]
    fn a_circle_is_found_through_submodules_and_super() {
        let g = graph(&[
            ("lib.rs", LIB),
            ("driver.rs", ""),
            ("tools/mod.rs", "mod plan;\nuse self::plan::Plan;\n"),
            (
                "tools/plan.rs",
                "use super::Launch;\nuse crate::roles::call;\n",
            ),
            ("roles.rs", "use super::writer::Writer;\n"),
            ("writer.rs", "fn f() { super::tools::batch(); }\n"),
        ]);
        let violations = check_graph("k", &g, "driver");
        assert_eq!(
            violations,
            [
                "k: modules roles, tools, writer import each other in a circle, such as \
              roles → writer → tools → roles (super::writer::Writer in roles.rs; \
              super::tools::batch in writer.rs; crate::roles::call in tools/plan.rs)"
            ]
        );
    }

    #[test]
    fn an_item_of_the_crate_root_is_refused() {
        let g = graph(&[
            ("lib.rs", "mod tools;\npub struct Engine;\n"),
            ("tools.rs", "use crate::Engine;\n"),
        ]);
        let violations = check_graph("k", &g, "driver");
        assert_eq!(violations.len(), 1, "{violations:?}");
        assert!(violations[0].starts_with(
            "k: module tools names crate::Engine (crate::Engine in tools.rs), which is no module"
        ));
    }

    #[test]
    fn strings_comments_and_lifetimes_are_not_code() {
        let code = strip(
            "let a = 'x'; fn f<'a>(s: &'a str) {} // crate::a\n/* crate::b */ \"crate::c\" r#\"crate::d\"# '\\n' crate::e",
        );
        assert_eq!(code.matches("crate::").count(), 1, "{code}");
        assert!(code.contains("<'a>"), "{code}");
    }
}
