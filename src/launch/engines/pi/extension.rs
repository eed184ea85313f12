//! The relay's pi extension, brought by `serve` (docs/DESIGN.md,
//! *Launching*, pi). pi talks to the relay only through its extension
//! (`scripts/pi-extension.ts`), which a user gets into pi with `pi install`;
//! after `npm i -g agent-relay` or `cargo install` alone pi has none, and a
//! launched pi would never join. So the binary carries the extension and
//! the manifest it reads beside it (`../extension-manifest.json`), writes
//! them into a folder of the relay's (`<state>/pi-extension/`, 0700, the
//! files 0600, checked as the relay's own files are) and hands the file to
//! pi with `-e` — only when pi does not load the relay's package already:
//! two copies would be two sidecars for one session.
//!
//! Whether pi loads it is read where pi 0.73.1 records it (`packages.md`
//! and `settings.md` in pi-coding-agent's npm package, and its
//! `package-manager.js`):
//! `packages` in `settings.json` — the global one in pi's agent folder
//! (`$PI_CODING_AGENT_DIR`, else `~/.pi/agent`) and the project's
//! (`<folder>/.pi/settings.json`) — as `npm:agent-relay[@version]`, a git
//! source whose repository is `agent-relay`, or a local path to the
//! package; an entry that filters out every extension (`"extensions": []`)
//! loads none. Also a local extension path in either file's `extensions`,
//! a file or package in the folders pi discovers (`<agent>/extensions/`,
//! `<folder>/.pi/extensions/`), and `-e` in `[launch.commands]` itself.
//! What pi really loaded is checked once it runs (`get_commands`): one
//! that loaded no copy after all (a package not installed, a filter) is
//! started again with the relay's own.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::paths::{Missing, Paths};

/// The extension, as this binary was built with it.
const EXTENSION: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/scripts/pi-extension.ts"
));
/// The manifest the extension reads beside it: its commands, the sidecar's
/// command line.
const MANIFEST: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/extension-manifest.json"
));
/// The relay's npm package (and repository) name.
const PACKAGE: &str = "agent-relay";
/// The extension's file name in the package.
const FILE: &str = "pi-extension.ts";

/// What pi sees of its surroundings: the folder it starts in, its agent
/// folder and the home `~` stands for (from the agent's own environment).
pub(super) struct PiPlaces {
    folder: PathBuf,
    agent_dir: Option<PathBuf>,
    home: Option<PathBuf>,
}

impl PiPlaces {
    pub fn new(folder: &Path, env: &[(OsString, OsString)]) -> Self {
        let var = |name: &str| {
            env.iter()
                .find(|(k, _)| k == name)
                .map(|(_, v)| PathBuf::from(v))
                .filter(|v| !v.as_os_str().is_empty())
        };
        let home = var("HOME");
        let agent_dir = match var("PI_CODING_AGENT_DIR") {
            Some(dir) => Some(expand(&dir, home.as_deref())),
            None => home.as_ref().map(|h| h.join(".pi").join("agent")),
        };
        Self {
            folder: folder.to_path_buf(),
            agent_dir,
            home,
        }
    }

    /// Where pi loads the relay's extension from by itself (for the log),
    /// or `None`: then `serve` brings it.
    pub fn loads_relay(&self, argv: &[String]) -> Option<String> {
        let by_command = argv
            .windows(2)
            .filter(|w| w[0] == "-e" || w[0] == "--extension")
            .map(|w| w[1].as_str())
            .find(|source| self.is_relay_source(source, &self.folder));
        if let Some(source) = by_command {
            return Some(format!("-e {source} in [launch.commands]"));
        }
        let project = self.folder.join(".pi");
        let scopes = [Some(project), self.agent_dir.clone()];
        for base in scopes.into_iter().flatten() {
            let file = base.join("settings.json");
            let settings = read_json(&file);
            let packages = settings["packages"].as_array().into_iter().flatten();
            for package in packages {
                let (source, filter) = match package {
                    Value::String(source) => (source.as_str(), None),
                    Value::Object(entry) => match entry.get("source").and_then(Value::as_str) {
                        Some(source) => (source, entry.get("extensions")),
                        None => continue,
                    },
                    _ => continue,
                };
                let none = filter
                    .and_then(Value::as_array)
                    .is_some_and(|only| only.is_empty());
                if !none && self.is_relay_source(source, &base) {
                    return Some(format!("{source} in {}", file.display()));
                }
            }
            let extensions = settings["extensions"].as_array().into_iter().flatten();
            for path in extensions.filter_map(Value::as_str) {
                if is_local(path) && self.is_relay_path(&self.resolve(path, &base)) {
                    return Some(format!("{path} in {}", file.display()));
                }
            }
            let discovered = base.join("extensions");
            let entries = std::fs::read_dir(&discovered).into_iter().flatten();
            for entry in entries.flatten() {
                if self.is_relay_path(&entry.path()) {
                    return Some(entry.path().display().to_string());
                }
            }
        }
        None
    }

    /// A package source naming the relay (`base`: what a relative path
    /// starts from).
    fn is_relay_source(&self, source: &str, base: &Path) -> bool {
        let source = source.trim();
        if let Some(spec) = source.strip_prefix("npm:") {
            return npm_name(spec.trim()) == PACKAGE;
        }
        if is_local(source) {
            return self.is_relay_path(&self.resolve(source, base));
        }
        git_repository(source).is_some_and(|(host, path)| {
            let name = path.rsplit('/').next().unwrap_or_default();
            let cloned = base.join("git").join(host).join(&path);
            name == PACKAGE || package_name(&cloned).as_deref() == Some(PACKAGE)
        })
    }

    /// A file that is the relay's extension, or a folder that is its package.
    fn is_relay_path(&self, path: &Path) -> bool {
        if path.is_dir() {
            return package_name(path).as_deref() == Some(PACKAGE);
        }
        let Ok(file) = path.canonicalize() else {
            return false;
        };
        let package = file.parent().and_then(Path::parent);
        file.file_name().is_some_and(|name| name == FILE)
            && package.is_some_and(|dir| {
                package_name(dir).as_deref() == Some(PACKAGE)
                    || read_json(&dir.join("extension-manifest.json"))["name"] == PACKAGE
            })
    }

    /// A path as pi resolves it: `~` is the home, a relative one is below
    /// `base`.
    fn resolve(&self, path: &str, base: &Path) -> PathBuf {
        let path = expand(Path::new(path.trim()), self.home.as_deref());
        if path.is_absolute() {
            path
        } else {
            base.join(path)
        }
    }
}

/// Writes the extension and its manifest into the relay's state folder,
/// each only when it differs from what is there; answers the extension's
/// path for `-e`.
pub(super) fn bring(paths: &Paths) -> Result<PathBuf, String> {
    let dir = paths.state_dir.join("pi-extension");
    let scripts = dir.join("scripts");
    for folder in [&dir, &scripts] {
        paths
            .check_own_dir(folder, Missing::Create)
            .map_err(|e| e.to_string())?;
    }
    let extension = scripts.join(FILE);
    for (path, text) in [
        (dir.join("extension-manifest.json"), MANIFEST),
        (extension.clone(), EXTENSION),
    ] {
        crate::paths::check_private_file(&path).map_err(|e| e.to_string())?;
        if std::fs::read(&path).is_ok_and(|there| there == text.as_bytes()) {
            continue;
        }
        crate::paths::replace_file(&path, text.as_bytes(), 0o600)
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    Ok(extension)
}

/// The command the extension registers first (`telegram-connect`): pi
/// lists it once per copy of the extension it loaded.
pub(super) fn relay_command() -> Option<String> {
    let manifest: Value = serde_json::from_str(MANIFEST).ok()?;
    manifest["commands"][0]["name"].as_str().map(str::to_string)
}

/// How many copies of the relay's extension pi loaded, from its
/// `get_commands` answer.
pub(super) fn loaded_copies(commands: &Value) -> usize {
    let Some(name) = relay_command() else {
        return 0;
    };
    commands["commands"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["source"] == "extension" && c["name"] == name.as_str())
        .count()
}

/// `~` and `~/…` as the home.
fn expand(path: &Path, home: Option<&Path>) -> PathBuf {
    match (path.strip_prefix("~"), home) {
        (Ok(rest), Some(home)) => home.join(rest),
        _ => path.to_path_buf(),
    }
}

/// pi's rule (`isLocalPath`): anything but a package or URL source.
fn is_local(source: &str) -> bool {
    let source = source.trim();
    !["npm:", "git:", "github:", "http:", "https:", "ssh:"]
        .iter()
        .any(|prefix| source.starts_with(prefix))
}

/// The name in an npm spec: `name`, `name@1.2`, `@scope/name@1.2`.
fn npm_name(spec: &str) -> &str {
    let at = if let Some(scoped) = spec.strip_prefix('@') {
        scoped.find('@').map(|i| i + 1)
    } else {
        spec.find('@')
    };
    at.map_or(spec, |at| &spec[..at])
}

/// The host and `owner/repository` of a git source (`git:github.com/o/r@v1`,
/// `https://github.com/o/r.git`, `git:git@github.com:o/r`), without a ref.
fn git_repository(source: &str) -> Option<(String, String)> {
    let url = source.strip_prefix("git:").unwrap_or(source).trim();
    let rest = ["https://", "http://", "ssh://", "git://"]
        .iter()
        .find_map(|scheme| url.strip_prefix(scheme))
        .unwrap_or(url);
    let rest = rest.split_once('@').map_or(
        rest,
        |(user, after)| {
            if user.contains('/') { rest } else { after }
        },
    );
    let (host, path) = rest.split_once([':', '/'])?;
    let path = path.split_once('@').map_or(path, |(path, _)| path);
    let path = path.trim_end_matches('/').trim_end_matches(".git");
    (!host.is_empty() && !path.is_empty()).then(|| (host.to_string(), path.to_string()))
}

/// The `name` in `dir/package.json`.
fn package_name(dir: &Path) -> Option<String> {
    read_json(&dir.join("package.json"))["name"]
        .as_str()
        .map(str::to_string)
}

/// A JSON file, or `null` when it is missing or broken (pi then loads
/// nothing from it).
fn read_json(path: &Path) -> Value {
    std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice(&bytes).ok())
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A folder pi starts in and its agent folder, under a temporary home.
    struct World {
        home: tempfile::TempDir,
    }

    impl World {
        fn new() -> Self {
            let world = Self {
                home: tempfile::tempdir().unwrap(),
            };
            std::fs::create_dir_all(world.folder().join(".pi")).unwrap();
            std::fs::create_dir_all(world.agent()).unwrap();
            world
        }

        fn folder(&self) -> PathBuf {
            self.home.path().join("code/api")
        }

        fn agent(&self) -> PathBuf {
            self.home.path().join(".pi/agent")
        }

        fn places(&self) -> PiPlaces {
            let env = [(OsString::from("HOME"), self.home.path().into())];
            PiPlaces::new(&self.folder(), &env)
        }

        fn settings(&self, project: bool, json: &str) {
            let dir = if project {
                self.folder().join(".pi")
            } else {
                self.agent()
            };
            std::fs::write(dir.join("settings.json"), json).unwrap();
        }

        /// A copy of the relay's package at `dir`.
        fn package(&self, dir: &Path) -> PathBuf {
            std::fs::create_dir_all(dir.join("scripts")).unwrap();
            std::fs::write(dir.join("package.json"), r#"{"name": "agent-relay"}"#).unwrap();
            std::fs::write(dir.join("extension-manifest.json"), MANIFEST).unwrap();
            let file = dir.join("scripts").join(FILE);
            std::fs::write(&file, "export default () => {}").unwrap();
            file
        }
    }

    #[test]
    fn pi_without_the_package_gets_the_relays_extension() {
        let world = World::new();
        assert_eq!(world.places().loads_relay(&["pi".into()]), None);
        world.settings(
            false,
            r#"{"packages": ["npm:pi-skills", "npm:@org/agent-relay"]}"#,
        );
        world.settings(true, "not json");
        assert_eq!(world.places().loads_relay(&["pi".into()]), None);
    }

    #[test]
    fn the_package_in_pis_settings_is_found_however_it_is_named() {
        for (project, json) in [
            (false, r#"{"packages": ["npm:agent-relay"]}"#),
            (false, r#"{"packages": ["npm:agent-relay@0.1.0"]}"#),
            (
                true,
                r#"{"packages": [{"source": "npm:agent-relay", "skills": []}]}"#,
            ),
            (
                false,
                r#"{"packages": ["git:github.com/someone/agent-relay@v1"]}"#,
            ),
            (
                false,
                r#"{"packages": ["https://github.com/someone/agent-relay.git"]}"#,
            ),
            (
                true,
                r#"{"packages": ["git:git@github.com:someone/agent-relay"]}"#,
            ),
        ] {
            let world = World::new();
            world.settings(project, json);
            let found = world.places().loads_relay(&["pi".into()]);
            assert!(found.is_some(), "{json}");
        }
        let world = World::new();
        world.settings(
            false,
            r#"{"packages": [{"source": "npm:agent-relay", "extensions": []}]}"#,
        );
        assert_eq!(
            world.places().loads_relay(&["pi".into()]),
            None,
            "a filter that keeps no extension loads none"
        );
    }

    #[test]
    fn a_local_copy_of_the_package_is_found_in_settings_folders_and_the_command() {
        // A checkout installed by path (`pi install ./agent-relay`), relative to
        // the global settings' folder.
        let world = World::new();
        world.package(&world.home.path().join("src/relay"));
        world.settings(false, r#"{"packages": ["../../src/relay"]}"#);
        assert!(world.places().loads_relay(&["pi".into()]).is_some());

        // The extension file itself, among a project's `extensions`.
        let world = World::new();
        let file = world.package(&world.home.path().join("src/relay"));
        world.settings(
            true,
            &format!(r#"{{"extensions": ["{}"]}}"#, file.display()),
        );
        assert!(world.places().loads_relay(&["pi".into()]).is_some());

        // The package in the folder pi discovers extensions in.
        let world = World::new();
        world.package(&world.agent().join("extensions/relay"));
        assert!(world.places().loads_relay(&["pi".into()]).is_some());

        // `-e` in [launch.commands], relative to the folder pi starts in.
        let world = World::new();
        world.package(&world.folder().join("vendor/relay"));
        let argv = ["pi", "-e", "vendor/relay/scripts/pi-extension.ts"].map(String::from);
        assert!(world.places().loads_relay(&argv).is_some());
        let other = ["pi", "-e", "./elsewhere.ts"].map(String::from);
        assert_eq!(world.places().loads_relay(&other), None);
    }

    #[test]
    fn pis_agent_folder_comes_from_its_environment() {
        let home = tempfile::tempdir().unwrap();
        let env = [
            (OsString::from("HOME"), home.path().into()),
            (OsString::from("PI_CODING_AGENT_DIR"), "~/pi-agent".into()),
        ];
        let places = PiPlaces::new(home.path(), &env);
        assert_eq!(places.agent_dir, Some(home.path().join("pi-agent")));
    }

    #[test]
    fn sources_are_read_as_pi_reads_them() {
        assert_eq!(npm_name("agent-relay@1.2.3"), "agent-relay");
        assert_eq!(npm_name("@scope/agent-relay@1"), "@scope/agent-relay");
        assert_eq!(npm_name("@scope/agent-relay"), "@scope/agent-relay");
        let repo = |s: &str| git_repository(s).map(|(h, p)| format!("{h} {p}"));
        assert_eq!(
            repo("git:github.com/o/agent-relay@v1").as_deref(),
            Some("github.com o/agent-relay")
        );
        assert_eq!(
            repo("ssh://git@github.com/o/agent-relay.git").as_deref(),
            Some("github.com o/agent-relay")
        );
        assert_eq!(
            repo("git:git@github.com:o/agent-relay").as_deref(),
            Some("github.com o/agent-relay")
        );
        assert!(is_local("./x") && is_local("/x") && is_local("x"));
        assert!(!is_local("npm:x") && !is_local("https://x"));
    }

    #[test]
    fn the_extension_is_written_private_beside_its_manifest_and_counted_once_per_copy() {
        let home = tempfile::tempdir().unwrap();
        let paths = Paths::under(home.path());
        let file = bring(&paths).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), EXTENSION);
        let manifest = file
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("extension-manifest.json");
        assert_eq!(std::fs::read_to_string(&manifest).unwrap(), MANIFEST);
        use std::os::unix::fs::PermissionsExt;
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&file), 0o600);
        assert_eq!(mode(file.parent().unwrap()), 0o700);
        assert_eq!(
            bring(&paths).unwrap(),
            file,
            "a second start finds it there"
        );

        // The file the relay wrote is the relay's extension, as pi would find it.
        let world = World::new();
        world.settings(
            false,
            &format!(r#"{{"extensions": ["{}"]}}"#, file.display()),
        );
        assert!(world.places().loads_relay(&["pi".into()]).is_some());

        let name = relay_command().unwrap();
        let commands = serde_json::json!({"commands": [
            {"name": name, "source": "extension", "path": "/a"},
            {"name": name, "source": "prompt"},
            {"name": "other", "source": "extension"},
        ]});
        assert_eq!(loaded_copies(&commands), 1);
        assert_eq!(loaded_copies(&serde_json::json!({"commands": []})), 0);
    }
}
