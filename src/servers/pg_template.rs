//! A copy of a fresh `initdb` kept between runs, so that a private Postgres starts from a
//! copy of it instead of running `initdb` again.
//!
//! `initdb` builds a cluster's catalogs from scratch: seconds of CPU on a busy machine,
//! paid by every lab, test and `lockslab up` that starts a Postgres. A copy of its result
//! takes a tenth of that. The copy is not handed out as it is: every cluster that starts
//! from it is first given a superuser password of its own (see
//! [`super::PrivateServers::start_initdb`]), so no two servers share one, and the template
//! itself was made with a password that was never written anywhere but its own
//! `pg_authid`, then thrown away.
//!
//! It lives in the user's cache directory (`$XDG_CACHE_HOME/lockslab`, else
//! `~/.cache/lockslab`), in a directory only that user may enter — as root too, where the
//! servers themselves run as another user: what the template holds is copied out by
//! lockslab and only then handed to that user. Deleting the directory costs nothing but
//! one `initdb` at the next start. Nothing is cached when there is no home directory to
//! keep it in, or when the directory there is not this user's alone.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use nix::unistd::{Gid, Uid};

use super::hand_over;

/// Changes whenever what goes into a template changes (the `initdb` flags, say), so that a
/// template made the old way is no longer picked up.
const FORMAT: u32 = 1;

/// Where this user's templates live, made if missing; None when there is no place that is
/// this user's alone (see the module's doc).
fn cache_dir() -> Option<PathBuf> {
    let base = match std::env::var_os("XDG_CACHE_HOME").filter(|v| !v.is_empty()) {
        Some(cache) => PathBuf::from(cache),
        None => {
            // A home that does not exist is not made (HOME=/nonexistent, as root).
            let home = PathBuf::from(std::env::var_os("HOME").filter(|v| !v.is_empty())?);
            if !fs::symlink_metadata(&home).is_ok_and(|m| m.is_dir()) {
                return None;
            }
            home.join(".cache")
        }
    };
    if !base.is_absolute() {
        return None;
    }
    let dir = base.join("lockslab");
    let _ = fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir);
    let meta = fs::symlink_metadata(&dir).ok()?;
    let ours_alone =
        meta.is_dir() && meta.uid() == Uid::effective().as_raw() && meta.mode() & 0o077 == 0;
    ours_alone.then_some(dir)
}

/// The template's name for this `initdb` and locale: another Postgres installed, or a run
/// under another locale (the cluster's default collation comes from it), makes another one.
fn template_name(initdb: &Path) -> Option<String> {
    let binary = fs::metadata(initdb).ok()?;
    let locale: String = ["LC_ALL", "LC_COLLATE", "LC_CTYPE", "LANG"]
        .iter()
        .map(|var| std::env::var(var).unwrap_or_default())
        .collect::<Vec<_>>()
        .join(",");
    let key = format!(
        "{FORMAT}|{}|{}|{}|{}|{locale}",
        initdb.display(),
        binary.len(),
        binary.mtime(),
        binary.mtime_nsec()
    );
    // Not a secret, only a short stable name: FNV-1a.
    let hash = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    Some(format!("pg-template-{hash:016x}"))
}

/// The template made by this `initdb`, when one was kept.
pub(super) fn find(initdb: &Path) -> Option<PathBuf> {
    let template = cache_dir()?.join(template_name(initdb)?);
    let meta = fs::symlink_metadata(&template).ok()?;
    (meta.is_dir() && meta.uid() == Uid::effective().as_raw()).then_some(template)
}

/// Keeps a copy of `data`, a cluster `initdb` has just made and no server has run on, as
/// this `initdb`'s template. Best effort: a template that cannot be kept only means the next
/// start runs `initdb` too. Written beside its final name and renamed into place, so that a
/// run starting meanwhile finds either no template or a whole one.
pub(super) fn keep(initdb: &Path, data: &Path) {
    let (Some(cache), Some(name)) = (cache_dir(), template_name(initdb)) else {
        return;
    };
    if cache.join(&name).exists() {
        return;
    }
    sweep_partials(&cache);
    let partial = cache.join(format!("{name}.partial-{}", std::process::id()));
    let _ = fs::remove_dir_all(&partial);
    // Synced: a template cut short by a power cut would break every start after it.
    let kept = copy_tree(data, &partial, None, true)
        .and_then(|()| fs::rename(&partial, cache.join(&name)).map_err(Into::into));
    if kept.is_err() {
        // Another run's rename came first, or the disk is full: either way, not ours to keep.
        let _ = fs::remove_dir_all(&partial);
    }
}

/// Removes the half-written templates of runs that died while keeping one (their pid is
/// in the name, and gone).
fn sweep_partials(cache: &Path) {
    let Ok(entries) = fs::read_dir(cache) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some((_, pid)) = name.rsplit_once(".partial-") else {
            continue;
        };
        if pid
            .parse::<u32>()
            .is_ok_and(|pid| !Path::new(&format!("/proc/{pid}")).exists())
        {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

/// Copies the directory tree `from` into `to` (which must not exist), modes kept, every
/// entry handed to `owner` when given. Anything but directories and plain files (a symlink
/// above all) is refused: a cluster made by `initdb` has nothing else.
pub(super) fn copy_tree(
    from: &Path,
    to: &Path,
    owner: Option<(Uid, Gid)>,
    sync: bool,
) -> Result<()> {
    let meta = fs::symlink_metadata(from).with_context(|| format!("reading {}", from.display()))?;
    fs::DirBuilder::new()
        .mode(0o700)
        .create(to)
        .with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from)? {
        let entry = entry?;
        let (source, target) = (entry.path(), to.join(entry.file_name()));
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_tree(&source, &target, owner, sync)?;
        } else if kind.is_file() {
            // `fs::copy` keeps the permission bits.
            fs::copy(&source, &target).with_context(|| format!("copying {}", source.display()))?;
            if sync {
                fs::File::open(&target)?.sync_all()?;
            }
            hand_over(&target, owner)?;
        } else {
            bail!("{} is neither a file nor a directory", source.display());
        }
    }
    fs::set_permissions(to, fs::Permissions::from_mode(meta.mode() & 0o7777))?;
    hand_over(to, owner)?;
    if sync {
        fs::File::open(to)?.sync_all()?;
    }
    Ok(())
}
