//! What a volume holds: its manifest (every regular file, its size and
//! blake3 hash), and safe paths inside it. Symbolic links are not followed
//! and not listed, so nothing outside the volume is ever read through it.

use std::collections::HashMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use herd_core::api::{ManifestFile, VolumeManifest};

/// Every regular file under `dir`: its path relative to `dir`
/// (`/`-separated) and its metadata.
pub fn files(dir: &Path) -> std::io::Result<Vec<(String, std::fs::Metadata)>> {
    let mut found = Vec::new();
    let mut pending = vec![PathBuf::new()];
    while let Some(relative) = pending.pop() {
        for item in std::fs::read_dir(dir.join(&relative))? {
            let item = item?;
            let kind = item.file_type()?;
            let path = relative.join(item.file_name());
            if kind.is_dir() {
                pending.push(path);
            } else if kind.is_file() {
                let name = path.to_str().ok_or_else(|| std::io::Error::other("a file name is not UTF-8"))?;
                found.push((name.to_string(), item.metadata()?));
            }
        }
    }
    Ok(found)
}

/// The manifest of the volume in `dir`.
pub fn manifest(dir: &Path) -> std::io::Result<VolumeManifest> {
    manifest_cached(dir, &HashCache::default())
}

/// File hashes by path, size and modification time: a file that did not
/// change is not read again (what rsync assumes too).
#[derive(Default)]
pub struct HashCache(Mutex<HashMap<PathBuf, (u64, SystemTime, String)>>);

/// The manifest of the volume in `dir`, hashing only files that changed
/// since `cache` saw them.
pub fn manifest_cached(dir: &Path, cache: &HashCache) -> std::io::Result<VolumeManifest> {
    let listed = files(dir)?;
    let known = |path: &Path, metadata: &std::fs::Metadata| -> std::io::Result<Option<String>> {
        let modified = metadata.modified()?;
        let cached = cache.0.lock().ok().and_then(|c| c.get(path).cloned());
        Ok(cached.filter(|(size, time, _)| *size == metadata.len() && *time == modified).map(|(_, _, hash)| hash))
    };
    let mut hashes = Vec::with_capacity(listed.len());
    for (path, metadata) in &listed {
        hashes.push(known(&dir.join(path), metadata)?);
    }
    // Files not seen before are hashed on every core: a volume's first
    // manifest is on the critical path of its first copy.
    let unknown: Vec<usize> = (0..listed.len()).filter(|i| hashes[*i].is_none()).collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(unknown.len());
    let hashed: Vec<(usize, u64, String)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut done = Vec::new();
                    while let Some(&i) = unknown.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                        let (size, hash) = hash_file(&dir.join(&listed[i].0))?;
                        done.push((i, size, hash));
                    }
                    Ok::<_, std::io::Error>(done)
                })
            })
            .collect();
        let mut all = Vec::new();
        for worker in workers {
            all.extend(worker.join().map_err(|_| std::io::Error::other("a hashing thread panicked"))??);
        }
        Ok::<_, std::io::Error>(all)
    })?;
    for (i, size, hash) in hashed {
        let (path, metadata) = &listed[i];
        if let Ok(mut cache) = cache.0.lock() {
            cache.insert(dir.join(path), (size, metadata.modified()?, hash.clone()));
        }
        hashes[i] = Some(hash);
    }
    let files: Vec<ManifestFile> = listed
        .into_iter()
        .zip(hashes)
        .map(|((path, metadata), hash)| ManifestFile { path, size: metadata.len(), blake3: hash.unwrap_or_default() })
        .collect();
    // Forget files of this volume that are gone, so the cache holds only live ones.
    if let Ok(mut cache) = cache.0.lock() {
        cache.retain(|known, _| !known.starts_with(dir) || files.iter().any(|f| dir.join(&f.path) == *known));
    }
    Ok(VolumeManifest::of(files))
}

/// The bytes in all regular files under `dir` (a copy being staged),
/// without hashing them.
pub fn staged_bytes(dir: &Path) -> std::io::Result<u64> {
    Ok(files(dir)?.iter().map(|(_, metadata)| metadata.len()).sum())
}

/// A file's size and blake3 hash.
pub fn hash_file(path: &Path) -> std::io::Result<(u64, String)> {
    let mut hasher = blake3::Hasher::new();
    let size = hash_into(path, &mut hasher)?;
    Ok((size, hasher.finalize().to_hex().to_string()))
}

/// Feeds a file's content to `hasher`; returns its size.
pub fn hash_into(path: &Path, hasher: &mut blake3::Hasher) -> std::io::Result<u64> {
    let mut file = std::fs::File::open(path)?;
    let mut buffer = vec![0; 256 * 1024];
    let mut size = 0;
    loop {
        let read = file.read(&mut buffer)?;
        if read == 0 {
            return Ok(size);
        }
        hasher.update(&buffer[..read]);
        size += read as u64;
    }
}

/// `relative` inside `dir`, or None when it could leave it (absolute, or
/// with `..`).
pub fn inside(dir: &Path, relative: &str) -> Option<PathBuf> {
    let path = Path::new(relative);
    let plain = path.components().all(|c| matches!(c, Component::Normal(_)));
    (plain && !relative.is_empty()).then(|| dir.join(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_lists_files_not_links_and_changes_with_content() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sub")).unwrap();
        std::fs::write(dir.path().join("a"), b"hello").unwrap();
        std::fs::write(dir.path().join("sub/b"), b"world!").unwrap();
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).unwrap();
        let first = manifest(dir.path()).unwrap();
        let paths: Vec<_> = first.files.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(paths, ["a", "sub/b"]);
        assert_eq!(first.size, 11);
        std::fs::write(dir.path().join("a"), b"hellO").unwrap();
        assert_ne!(manifest(dir.path()).unwrap().checksum, first.checksum);
    }

    #[test]
    fn the_cache_skips_unchanged_files_and_sees_changed_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), b"one").unwrap();
        let cache = HashCache::default();
        let first = manifest_cached(dir.path(), &cache).unwrap();
        assert_eq!(first, manifest(dir.path()).unwrap());
        // A changed size is seen even within the clock's resolution.
        std::fs::write(dir.path().join("a"), b"three").unwrap();
        let second = manifest_cached(dir.path(), &cache).unwrap();
        assert_ne!(second.checksum, first.checksum);
        assert_eq!(second, manifest(dir.path()).unwrap());
    }

    #[test]
    fn paths_cannot_leave_the_volume() {
        let dir = Path::new("/data/v");
        assert_eq!(inside(dir, "a/b"), Some(PathBuf::from("/data/v/a/b")));
        for bad in ["../x", "/etc/passwd", "a/../../x", ""] {
            assert_eq!(inside(dir, bad), None, "{bad}");
        }
    }
}
