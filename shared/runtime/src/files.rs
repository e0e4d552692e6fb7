//! Files that other processes read while this one may be writing them: the addresses and the
//! admin token `allot up` leaves in its data folder for the commands run beside it.
//!
//! [`std::fs::write`] truncates the file before it writes, so a reader that comes between sees
//! it empty: a command run just as `allot up` announced itself would take an empty URL for the
//! gateway's. [`write_whole`] writes a temporary file beside the target, syncs it and renames it
//! into place, so a reader finds no file, the old one, or the new one whole.

use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

/// Replaces `path` with `contents` in one step, readable as `mode` (e.g. `0o600` for a secret);
/// its folder is created if missing.
pub fn write_whole(path: &Path, contents: &[u8], mode: u32) -> std::io::Result<()> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let mut file = tempfile::Builder::new()
        .permissions(std::fs::Permissions::from_mode(mode))
        .tempfile_in(dir)?;
    file.write_all(contents)?;
    file.as_file().sync_all()?;
    file.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::*;

    /// A reader that opened the file before it was replaced still reads the old contents whole,
    /// and the path gives the new ones: the file was swapped, never emptied and refilled.
    #[test]
    fn a_reader_sees_the_old_file_or_the_new_one_never_a_truncated_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("gateway.url");
        write_whole(&path, b"http://127.0.0.1:1/\n", 0o644).unwrap();
        let mut before = std::fs::File::open(&path).unwrap();

        write_whole(&path, b"http://127.0.0.1:2/\n", 0o600).unwrap();

        let mut old = String::new();
        before.read_to_string(&mut old).unwrap();
        assert_eq!(old, "http://127.0.0.1:1/\n");
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "http://127.0.0.1:2/\n"
        );
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        // Nothing is left beside it.
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["gateway.url"]);
    }
}
