//! The import graph of `src/` against the layers `src/lib.rs` lists: every
//! `crate::<module>` path (in `use` lines and inline) of a file under
//! `src/<module>` must name a module of a lower layer. Comments and the
//! trailing `#[cfg(test)] mod tests` of a file are not checked (a test may
//! reach for a helper of any layer). So no circle can form between
//! modules, and no module reaches up.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Module → layer, from the `//! - layer: ...` lines of `src/lib.rs`.
fn layers(lib: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    let lines = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("//! - layer:"));
    for (layer, line) in lines.enumerate() {
        for module in line.split(',') {
            let name = module.trim().trim_matches('`').to_string();
            assert!(!name.is_empty(), "empty module name in layer {layer}");
            assert!(
                out.insert(name.clone(), layer).is_none(),
                "{name} is listed twice"
            );
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file that is checked: without its trailing test module
/// and without comment lines.
fn checked_code(source: &str) -> String {
    let code = match source.find("#[cfg(test)]\nmod tests") {
        Some(i) => &source[..i],
        None => source,
    };
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules named by `crate::` paths in `code`, including
/// the items of `crate::{a, b::c}` groups.
fn referenced_modules(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let ident = |s: &str| -> String {
        s.trim_start()
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect()
    };
    for (i, _) in code.match_indices("crate::") {
        let rest = &code[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let end = group.find('}').unwrap_or(group.len());
            out.extend(group[..end].split(',').map(ident));
        } else {
            out.push(ident(rest));
        }
    }
    out.retain(|m| !m.is_empty());
    out
}

#[test]
fn no_module_uses_a_module_of_its_own_or_a_higher_layer() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = std::fs::read_to_string(root.join("lib.rs")).expect("lib.rs");
    let layers = layers(&lib);
    assert!(layers.len() > 10, "the layer list in lib.rs was not found");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let mut violations = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).expect("under src");
        let first = rel.components().next().expect("component");
        let top = first
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(&own) = layers.get(&top) else {
            violations.push(format!(
                "{}: module {top} is in no layer of lib.rs",
                rel.display()
            ));
            continue;
        };
        let source = std::fs::read_to_string(&file).expect("read");
        for module in referenced_modules(&checked_code(&source)) {
            if module == top {
                continue;
            }
            match layers.get(&module) {
                None => violations.push(format!(
                    "{}: crate::{module} is in no layer of lib.rs",
                    rel.display()
                )),
                Some(&theirs) if theirs >= own => violations.push(format!(
                    "{}: {top} (layer {own}) uses {module} (layer {theirs})",
                    rel.display()
                )),
                Some(_) => {}
            }
        }
    }
    violations.sort();
    violations.dedup();
    assert!(
        violations.is_empty(),
        "imports against the layering of lib.rs:\n{}",
        violations.join("\n")
    );
}

#[test]
fn the_checker_sees_grouped_and_inline_paths() {
    let code = "use crate::{log::X, shard};\nfn f() { crate::txn::g(); }\n// crate::server\n";
    assert_eq!(
        referenced_modules(&checked_code(code)),
        vec!["log", "shard", "txn"]
    );
}
