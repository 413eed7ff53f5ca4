//! Durable file operations every crate that writes files shares: the one
//! way to replace a file atomically, and the directory fsync that makes a
//! create, rename or delete survive a crash.
//!
//! A rename is only durable once the directory holding it is fsynced; without
//! it a crash can bring back the old file (or no file) even though the new
//! one's data was fsynced. Every atomic replacement goes through
//! [`write_atomic`] so that step is never forgotten.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Fsyncs a directory, so that entries created, renamed or removed in it
/// survive a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Replaces `path` with `bytes` atomically: a temporary file beside it is
/// written and fsynced, renamed over `path`, and the directory fsynced.
/// After it returns, a crash leaves either the complete new file or (if it
/// failed) the old one, never a torn mix.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = temp_path(path);
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    std::fs::rename(&tmp, path)?;
    sync_dir(parent_of(path))
}

/// Removes `path` if it exists; true when there was a file. The caller
/// fsyncs the directory (once for several removals).
pub fn remove_if_exists(path: &Path) -> io::Result<bool> {
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(e),
    }
}

/// Removes `path` if it exists and fsyncs its directory.
pub fn remove_durably(path: &Path) -> io::Result<()> {
    if remove_if_exists(path)? {
        sync_dir(parent_of(path))?;
    }
    Ok(())
}

/// `<name>.tmp` beside `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(".tmp");
    path.with_file_name(name)
}

fn parent_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replaces_the_file_and_leaves_no_temp() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.properties");
        write_atomic(&path, b"one").unwrap();
        write_atomic(&path, b"two").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"two");
        assert!(!temp_path(&path).exists());
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }

    #[test]
    fn a_failed_write_keeps_the_old_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x");
        write_atomic(&path, b"old").unwrap();
        // The temp name is taken by a directory: creating it fails.
        std::fs::create_dir(temp_path(&path)).unwrap();
        assert!(write_atomic(&path, b"new").is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
    }

    #[test]
    fn remove_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gone");
        remove_durably(&path).unwrap();
        std::fs::write(&path, b"x").unwrap();
        remove_durably(&path).unwrap();
        assert!(!path.exists());
    }
}
