//! The workspace's structure, read from the code's own imports: no module of
//! any crate imports, directly or through others, a module that imports it
//! back (no import circle), and no module imports a layer above its own in
//! the order its crate documents (lib.rs's "Layers", repeated in [`LAYERS`]). A file's imports are the `crate::`, `super::`
//! and `self::` paths it names outside its tests; a path to a name that a
//! module re-exports leads to where the name is defined, and a re-export
//! (`pub use`) hands a name on without depending on it; the crate roots
//! (lib.rs, main.rs), which only declare and re-export, are not counted, nor
//! is a module's use of the module it is declared in (a child is part of its
//! parent's concept, as farm-studio draws a folder).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One crate: its source files by module path (`a::b`; the root is empty).
struct Crate {
    name: String,
    files: BTreeMap<Vec<String>, PathBuf>,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn crates() -> Vec<Crate> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(workspace().join("crates")).expect("crates/") {
        let dir = entry.expect("an entry").path();
        let src = dir.join("src");
        if !src.is_dir() {
            continue;
        }
        let mut files = BTreeMap::new();
        collect(&src, &src, &mut files);
        let name = dir
            .file_name()
            .expect("a name")
            .to_string_lossy()
            .into_owned();
        out.push(Crate { name, files });
    }
    assert!(out.len() >= 4, "the workspace's crates");
    out
}

/// Every `.rs` file under `dir`, by module path relative to `src`.
fn collect(src: &Path, dir: &Path, files: &mut BTreeMap<Vec<String>, PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("a source folder") {
        let path = entry.expect("an entry").path();
        if path.is_dir() {
            collect(src, &path, files);
            continue;
        }
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let rel = path.strip_prefix(src).expect("under src");
        let mut module: Vec<String> = rel
            .with_extension("")
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        if matches!(
            module.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            module.pop();
        }
        files.insert(module, path);
    }
}

/// The file's code before its tests (`#[cfg(test)]`), comments dropped.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable source");
    text.lines()
        .take_while(|l| !l.trim_start().starts_with("#[cfg(test)]"))
        .map(|l| match l.find("//") {
            Some(at) => &l[..at],
            None => l,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Expands a use tree (`a::{b, c::{d, e}}`) into its paths.
fn expand(tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![path.to_string()];
    };
    let prefix = &tree[..open];
    let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(expand)
        .map(|p| match p.as_str() {
            "self" => prefix.trim_end_matches("::").to_string(),
            _ => format!("{prefix}{p}"),
        })
        .collect()
}

/// A statement (text up to a `;`) as a `use`: whether it re-exports, and
/// its use tree; `None` for any other statement.
fn as_use(statement: &str) -> Option<(bool, &str)> {
    let mut s = statement.trim_start();
    // Attributes (`#[cfg(...)]`) before it.
    while let Some(rest) = s.strip_prefix("#[") {
        s = rest
            .split_once(']')
            .map_or("", |(_, after)| after)
            .trim_start();
    }
    for (prefix, public) in [
        ("pub(crate) use ", true),
        ("pub(super) use ", true),
        ("pub use ", true),
        ("use ", false),
    ] {
        if let Some(rest) = s.strip_prefix(prefix) {
            return Some((public, rest));
        }
    }
    None
}

/// The `use` statements of `code`, each as (is a re-export, its paths).
fn uses(code: &str) -> Vec<(bool, Vec<String>)> {
    code.split(';')
        .filter_map(as_use)
        .map(|(public, tree)| (public, expand(tree)))
        .collect()
}

/// `code` without its `use` statements.
fn without_uses(code: &str) -> String {
    code.split(';')
        .filter(|s| as_use(s).is_none())
        .collect::<Vec<_>>()
        .join(";")
}

/// Paths written in code outside `use` statements (`crate::a::f(`).
fn inline_paths(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    for start in ["crate::", "super::"] {
        let mut rest = code;
        while let Some(at) = rest.find(start) {
            let before = rest[..at].chars().last();
            let tail = &rest[at..];
            let end = tail
                .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                .unwrap_or(tail.len());
            if before.is_none_or(|c| !(c.is_alphanumeric() || c == '_' || c == ':')) {
                out.push(tail[..end].trim_end_matches(':').to_string());
            }
            rest = &tail[end.max(1)..];
        }
    }
    out
}

/// `path` (as written in the module `at`) as an absolute path in the crate.
fn absolute(path: &str, at: &[String], is_mod_file: bool) -> Option<Vec<String>> {
    let mut parts: Vec<&str> = path.split("::").filter(|p| !p.is_empty()).collect();
    let mut base: Vec<String> = match parts.first() {
        Some(&"crate") => {
            parts.remove(0);
            Vec::new()
        }
        Some(&"self") => {
            parts.remove(0);
            at.to_vec()
        }
        Some(&"super") => {
            let mut base = at.to_vec();
            // In a.rs (module a), super is a's parent; so in a/mod.rs.
            while parts.first() == Some(&"super") {
                parts.remove(0);
                base.pop()?;
            }
            base
        }
        // A child module named from a mod.rs or the root (`use child::X`).
        Some(_) if is_mod_file || at.is_empty() => at.to_vec(),
        _ => return None,
    };
    base.extend(parts.iter().map(|p| p.to_string()));
    Some(base)
}

/// The module files of `krate` and, for each, the absolute paths it names
/// and the names it re-exports (name -> absolute path).
struct Module {
    names: Vec<Vec<String>>,
    exports: BTreeMap<String, Vec<String>>,
}

fn modules(krate: &Crate) -> BTreeMap<Vec<String>, Module> {
    let mut out = BTreeMap::new();
    for (module, path) in &krate.files {
        let is_mod_file = path
            .file_name()
            .is_some_and(|n| n == "mod.rs" || n == "lib.rs" || n == "main.rs");
        let code = code(path);
        let mut names = Vec::new();
        let mut exports = BTreeMap::new();
        for (public, paths) in uses(&code) {
            for p in paths {
                let Some(abs) = absolute(&p, module, is_mod_file) else {
                    continue;
                };
                if public {
                    if let Some(last) = abs.last() {
                        exports.insert(last.clone(), abs);
                    }
                    continue;
                }
                names.push(abs);
            }
        }
        for p in inline_paths(&without_uses(&code)) {
            if let Some(abs) = absolute(&p, module, is_mod_file) {
                names.push(abs);
            }
        }
        out.insert(module.clone(), Module { names, exports });
    }
    out
}

/// The module file a path leads to: its longest prefix that is a module,
/// followed through that module's re-exports of the next name.
fn target(
    path: &[String],
    modules: &BTreeMap<Vec<String>, Module>,
    depth: u32,
) -> Option<Vec<String>> {
    let at = (0..=path.len())
        .rev()
        .find(|n| modules.contains_key(&path[..*n]))?;
    let module = path[..at].to_vec();
    if depth < 8 {
        if let Some(next) = path.get(at) {
            if let Some(exported) = modules[&module].exports.get(next) {
                if exported.as_slice() != path {
                    let mut via = exported.clone();
                    via.extend(path[at + 1..].iter().cloned());
                    return target(&via, modules, depth + 1).or(Some(module));
                }
            }
        }
    }
    Some(module)
}

/// Each crate's layers as its lib.rs documents them, top first: the
/// top-level modules of each layer.
const LAYERS: [(&str, &[&[&str]]); 5] = [
    (
        "cachalot-core",
        &[
            &["report"],
            &["policy"],
            &["device_allocator"],
            &[
                "history",
                "private_pool",
                "segment_source",
                "sleep",
                "pool_id",
                "units",
                "snapshot",
                "summary",
                "event",
                "error",
                "backing",
                "addr_map",
                "recount",
                "transition",
                "stats",
                "config",
                "test_rng",
            ],
            &["backend"],
        ],
    ),
    (
        "cachalot-tools",
        &[
            &["trace", "replay", "tune", "view"],
            &["golden", "snapshot_io"],
        ],
    ),
    ("cachalot-ipc", &[&["import"], &["handle", "server"]]),
    (
        "cachalot-cuda",
        &[&["host", "capture"], &["registry", "runtime", "driver"]],
    ),
    (
        "cachalot-torch",
        &[
            &["dropin", "ffi", "ipc", "pools", "regions", "settings"],
            &["reply", "report", "global"],
            &["device", "sleep"],
            &["registry", "guard"],
            &["rows", "error", "context", "streams", "tags"],
        ],
    ),
];

/// The import edges of `krate` between module files.
fn edges(krate: &Crate) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let modules = modules(krate);
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, m) in &modules {
        let out = edges.entry(module.clone()).or_default();
        for name in &m.names {
            if let Some(t) = target(name, &modules, 0) {
                // Roots only declare and re-export; a module's own paths, and
                // its ancestors', are not edges.
                if !t.is_empty() && !module.is_empty() && !module.starts_with(&t) {
                    out.insert(t);
                }
            }
        }
    }
    edges
}

/// The import circles of `krate`: sets of module files that reach each other.
fn circles(krate: &Crate) -> Vec<Vec<String>> {
    strongly_connected(&edges(krate))
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| c.iter().map(|m| m.join("::")).collect())
        .collect()
}

/// The imports of `krate` that climb to a layer above their own, and the
/// top-level modules no layer names.
fn climbs(krate: &Crate, layers: &[&[&str]]) -> Vec<String> {
    let rank = |top: &str| layers.iter().position(|l| l.contains(&top));
    let mut out = Vec::new();
    for (from, targets) in edges(krate) {
        let Some(top) = from.first() else {
            continue; // the crate root
        };
        let Some(from_rank) = rank(top) else {
            out.push(format!("{top} is in no layer"));
            continue;
        };
        for to in targets {
            match rank(&to[0]) {
                Some(to_rank) if to_rank < from_rank => out.push(format!(
                    "{} imports {}, a layer above it",
                    from.join("::"),
                    to.join("::")
                )),
                None => out.push(format!("{} is in no layer", to[0])),
                _ => {}
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Tarjan's strongly connected components.
fn strongly_connected(
    edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
) -> Vec<Vec<Vec<String>>> {
    struct State<'a> {
        edges: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a Vec<String>, (usize, usize)>,
        stack: Vec<&'a Vec<String>>,
        on_stack: BTreeSet<&'a Vec<String>>,
        next: usize,
        out: Vec<Vec<Vec<String>>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a Vec<String>) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.edges.get(v).into_iter().flatten() {
            let Some((key, _)) = s.edges.get_key_value(w) else {
                continue;
            };
            if !s.index.contains_key(key) {
                visit(s, key);
                let low = s.index[key].1.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            } else if s.on_stack.contains(key) {
                let low = s.index[key].0.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut component = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                component.push(w.clone());
                if w == v {
                    break;
                }
            }
            s.out.push(component);
        }
    }
    let mut s = State {
        edges,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.out
}

/// The workspace's crates in the order docs/architecture.md draws them,
/// lowest first: a crate's `[dependencies]` name only crates before it.
const CRATES: [&str; 9] = [
    "cachalot-core",
    "cachalot-ipc",
    "cachalot-cuda",
    "cachalot-tools",
    "cachalot",
    "cachalot-testkit",
    "cachalot-tensor",
    "cachalot-torch",
    "cachalot-cli",
];

/// The workspace crates `name`'s manifest lists under `[dependencies]`.
fn dependencies(name: &str) -> Vec<String> {
    let manifest = workspace().join("crates").join(name).join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest).expect("a manifest");
    let mut section = "";
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            section = line;
        } else if section == "[dependencies]" && line.starts_with("cachalot") {
            let dep = line.split(['.', ' ', '=']).next().expect("a name");
            out.push(dep.to_string());
        }
    }
    out
}

#[test]
fn every_crate_depends_only_on_crates_below_it() {
    let on_disk: BTreeSet<String> = crates().into_iter().map(|c| c.name).collect();
    let listed: BTreeSet<String> = CRATES.iter().map(|c| c.to_string()).collect();
    assert_eq!(on_disk, listed, "CRATES names every crate of crates/");
    let mut found = Vec::new();
    for (rank, name) in CRATES.iter().enumerate() {
        for dep in dependencies(name) {
            match CRATES.iter().position(|c| *c == dep) {
                Some(r) if r < rank => {}
                _ => found.push(format!("{name} depends on {dep}, not a crate below it")),
            }
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
    assert_eq!(dependencies("cachalot-cuda"), ["cachalot-core"]);
    assert_eq!(dependencies("cachalot-tools"), ["cachalot-core"]);
    assert_eq!(dependencies("cachalot-ipc"), ["cachalot-core"]);
}

#[test]
fn no_crate_has_an_import_circle() {
    let mut found = Vec::new();
    for krate in crates() {
        for circle in circles(&krate) {
            found.push(format!("{}: {}", krate.name, circle.join(", ")));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_module_imports_a_layer_above_its_own() {
    let crates = crates();
    let mut found = Vec::new();
    for (name, layers) in LAYERS {
        let krate = crates
            .iter()
            .find(|c| c.name == name)
            .unwrap_or_else(|| panic!("crate {name}"));
        for climb in climbs(krate, layers) {
            found.push(format!("{name}: {climb}"));
        }
    }
    assert!(found.is_empty(), "{}", found.join("\n"));
}

#[test]
fn the_reader_finds_a_planted_circle() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let src = dir.path().join("src");
    std::fs::create_dir_all(src.join("b")).expect("folders");
    let write = |name: &str, text: &str| std::fs::write(src.join(name), text).expect("writes");
    write("lib.rs", "mod a;\nmod b;\npub use b::Thing;\n");
    write("a.rs", "use crate::{b::inner::Inner, Thing};\n");
    write(
        "b/mod.rs",
        "pub(crate) mod inner;\npub struct Thing;\nfn h() { inner::k(); }\n",
    );
    write(
        "b/inner.rs",
        "use super::Thing;\npub struct Inner;\nfn f() { crate::a::g(); }\n#[cfg(test)]\nmod tests { use crate::a; }\n",
    );
    let mut files = BTreeMap::new();
    collect(&src, &src, &mut files);
    let krate = Crate {
        name: "planted".into(),
        files,
    };
    assert_eq!(
        circles(&krate),
        vec![vec!["b::inner".to_string(), "a".to_string()]]
    );
}
