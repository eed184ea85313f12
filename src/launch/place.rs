//! Where an agent may run (docs/DESIGN.md, *Launching*, "Where agents may
//! run"): a folder beneath one of `[launch] roots` once every link in it is
//! resolved, a directory, and the user's own. There are no roots by
//! default: starting agents from the phone is off until the person names
//! the folders. Every refusal names the setting to change.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a folder was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "starting agents from the phone is off on this machine: add the folders agents may work in to {} as [launch] roots = [\"~/code\"], then restart agent-relay serve",
        config.display()
    )]
    NoRoots { config: PathBuf },
    #[error("{folder} is not a folder on this machine ({why})")]
    NotAFolder { folder: String, why: String },
    #[error(
        "{folder} is outside [launch] roots ({roots}): add it, or a folder above it, to roots in {}",
        config.display()
    )]
    Outside {
        folder: String,
        roots: String,
        config: PathBuf,
    },
    #[error(
        "{folder} leads through a link to {}, which is outside [launch] roots ({roots}); add that folder to roots in {} if agents may work there",
        target.display(),
        config.display()
    )]
    Escapes {
        folder: String,
        target: PathBuf,
        roots: String,
        config: PathBuf,
    },
    #[error(
        "{} belongs to another user (uid {owner}, you are uid {me}): agents run only in your own folders",
        folder.display()
    )]
    NotYours {
        folder: PathBuf,
        owner: u32,
        me: u32,
    },
}

/// Resolves `folder` as the person wrote it (`~/api`, `/srv/web`, or a
/// name looked up under each root in turn) and checks it: beneath a root
/// with every link resolved, a directory, owned by this user.
pub fn resolve(
    folder: &str,
    roots: &[PathBuf],
    home: Option<&Path>,
    config: &Path,
) -> Result<PathBuf, Refused> {
    if roots.is_empty() {
        return Err(Refused::NoRoots {
            config: config.to_path_buf(),
        });
    }
    let shown_roots = roots
        .iter()
        .map(|r| r.display().to_string())
        .collect::<Vec<_>>()
        .join(", ");
    let written = written(folder, roots, home);
    let resolved = std::fs::canonicalize(&written).map_err(|e| Refused::NotAFolder {
        folder: folder.to_string(),
        why: e.to_string(),
    })?;
    let meta = std::fs::metadata(&resolved).map_err(|e| Refused::NotAFolder {
        folder: folder.to_string(),
        why: e.to_string(),
    })?;
    if !meta.is_dir() {
        return Err(Refused::NotAFolder {
            folder: folder.to_string(),
            why: "not a directory".into(),
        });
    }
    let real_roots: Vec<PathBuf> = roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    if !real_roots.iter().any(|root| resolved.starts_with(root)) {
        let looked_inside = roots
            .iter()
            .chain(&real_roots)
            .any(|root| written.starts_with(root));
        return Err(if looked_inside {
            Refused::Escapes {
                folder: folder.to_string(),
                target: resolved,
                roots: shown_roots,
                config: config.to_path_buf(),
            }
        } else {
            Refused::Outside {
                folder: folder.to_string(),
                roots: shown_roots,
                config: config.to_path_buf(),
            }
        });
    }
    let me = crate::sys::euid();
    if meta.uid() != me {
        return Err(Refused::NotYours {
            folder: resolved,
            owner: meta.uid(),
            me,
        });
    }
    Ok(resolved)
}

/// The path a folder as written means: `~` expanded; a bare name is the
/// first root that has it.
fn written(folder: &str, roots: &[PathBuf], home: Option<&Path>) -> PathBuf {
    let folder = folder.trim();
    if let (Some(rest), Some(home)) = (
        folder.strip_prefix("~/").or((folder == "~").then_some("")),
        home,
    ) {
        return home.join(rest);
    }
    let path = PathBuf::from(folder);
    if path.is_absolute() {
        return path;
    }
    roots
        .iter()
        .map(|root| root.join(&path))
        .find(|p| p.exists())
        .unwrap_or_else(|| roots[0].join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_folder_beneath_a_root_is_taken_and_everything_else_refused_with_the_setting() {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path().canonicalize().unwrap();
        let code = home.join("code");
        let api = code.join("api");
        let secret = home.join("secret");
        std::fs::create_dir_all(&api).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        std::os::unix::fs::symlink(&secret, code.join("escape")).unwrap();
        std::fs::write(code.join("file"), "x").unwrap();
        let config = PathBuf::from("/home/ada/.config/agent-relay/config.toml");
        let roots = [PathBuf::from(
            "~/code".replace('~', &home.display().to_string()),
        )];
        let ok = |f: &str| resolve(f, &roots, Some(&home), &config);

        assert_eq!(ok("~/code/api").unwrap(), api);
        assert_eq!(
            ok("api").unwrap(),
            api,
            "a name is looked up under the roots"
        );
        assert_eq!(ok(&api.display().to_string()).unwrap(), api);
        assert!(matches!(ok("~/secret"), Err(Refused::Outside { .. })));
        assert!(matches!(ok("~/code/escape"), Err(Refused::Escapes { .. })));
        assert!(matches!(
            ok("~/code/../secret"),
            Err(Refused::Outside { .. }) | Err(Refused::Escapes { .. })
        ));
        assert!(matches!(ok("~/code/file"), Err(Refused::NotAFolder { .. })));
        assert!(matches!(ok("~/code/none"), Err(Refused::NotAFolder { .. })));
        let off = resolve("~/code/api", &[], Some(&home), &config).unwrap_err();
        assert!(off.to_string().contains("[launch] roots"), "{off}");
        let outside = ok("~/secret").unwrap_err().to_string();
        assert!(
            outside.contains("roots in /home/ada/.config/agent-relay/config.toml"),
            "{outside}"
        );
    }

    #[test]
    fn a_folder_of_another_user_is_refused() {
        if crate::sys::euid() != 0 {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let theirs = root.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::os::unix::fs::chown(&theirs, Some(4242), Some(4242)).unwrap();
        let refused = resolve("theirs", &[root], None, Path::new("config.toml")).unwrap_err();
        assert!(
            matches!(refused, Refused::NotYours { owner: 4242, .. }),
            "{refused}"
        );
    }
}
