//! Members' standard output and error, kept within a budget: each stream
//! goes through a pipe to a writer process (`herd log-writer`, started
//! with the member, outliving the agent as the member does) that writes
//! `<stream>.log` and rotates it by size: `<stream>.log.1` is the newest
//! of at most `keep` rotated files. A stream never has more than
//! `maxSize × (keep + 1)` bytes on disk.
//!
//! Offsets are the stream's own, across rotation: `<stream>.log.start`
//! says where in the stream the current file begins, so that a reader
//! (`herd logs`, `-f`) goes on from where it was through a rotation.

use std::fs::{File, OpenOptions};
use std::io::{ErrorKind, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use herd_core::kinds::member_run::LogRotation;

/// Bytes read from the pipe at once.
const CHUNK: usize = 64 << 10;
/// Rotated files looked for at most, whatever `keep` was.
const MOST_ROTATED: u32 = 1000;

fn rotated(path: &Path, index: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{index}"));
    PathBuf::from(name)
}

fn start_file(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".start");
    PathBuf::from(name)
}

/// Where in the stream the current file begins (0: never rotated).
fn read_start(path: &Path) -> u64 {
    std::fs::read_to_string(start_file(path)).ok().and_then(|t| t.trim().parse().ok()).unwrap_or(0)
}

fn write_start(path: &Path, start: u64) -> std::io::Result<()> {
    let file = start_file(path);
    let mut temporary = file.as_os_str().to_owned();
    temporary.push(".tmp");
    std::fs::write(&temporary, format!("{start}\n"))?;
    std::fs::rename(&temporary, &file)
}

/// Writes what `input` brings to `path`, rotating as `rotation` says,
/// until `input` ends. A write the disk refuses is dropped (the member
/// is never held up by its log), the next is tried.
pub fn write_rotated(path: &Path, rotation: &LogRotation, mut input: impl Read) -> std::io::Result<()> {
    let max = rotation.max_size.0.max(1);
    let open = || OpenOptions::new().create(true).append(true).open(path);
    let mut file = open()?;
    let mut size = file.metadata()?.len();
    let mut start = read_start(path);
    let mut buffer = vec![0; CHUNK];
    loop {
        let read = match input.read(&mut buffer) {
            Ok(0) => return Ok(()),
            Ok(read) => read,
            Err(error) if error.kind() == ErrorKind::Interrupted => continue,
            Err(error) => return Err(error),
        };
        let mut chunk = &buffer[..read];
        while !chunk.is_empty() {
            if size >= max {
                start += size;
                rotate(path, rotation.keep, start)?;
                file = open()?;
                size = 0;
            }
            let take = chunk.len().min(usize::try_from(max - size).unwrap_or(usize::MAX));
            // Counted as written even when refused: the stream goes on.
            let _ = file.write_all(&chunk[..take]);
            size += take as u64;
            chunk = &chunk[take..];
        }
    }
}

/// Each `path.N` becomes `path.N+1` (what would pass `keep` is removed),
/// `path` becomes `path.1`, and an empty file takes its place; the stream
/// goes on at `start`. `path` is never missing: the old file is linked as
/// `path.1` before the new one is renamed over it, and a reader that sees
/// the two the same file looks again.
fn rotate(path: &Path, keep: u32, start: u64) -> std::io::Result<()> {
    let gone = |result: std::io::Result<()>| match result {
        Err(error) if error.kind() != ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    };
    if keep > 0 {
        gone(std::fs::remove_file(rotated(path, keep)))?;
        for index in (1..keep).rev() {
            gone(std::fs::rename(rotated(path, index), rotated(path, index + 1)))?;
        }
        std::fs::hard_link(path, rotated(path, 1))?;
    }
    write_start(path, start)?;
    let mut fresh = path.as_os_str().to_owned();
    fresh.push(".new");
    File::create(&fresh)?;
    std::fs::rename(&fresh, path)
}

/// Removes what rotation kept of the stream at `path` and where it
/// stood, for a stream that starts over (a setup run's output); the
/// current file is the caller's to empty.
pub fn forget_rotated(path: &Path) -> std::io::Result<()> {
    // Rotated files are numbered from 1 without a gap.
    for index in 1..=MOST_ROTATED {
        match std::fs::remove_file(rotated(path, index)) {
            Err(error) if error.kind() == ErrorKind::NotFound => break,
            result => result?,
        }
    }
    match std::fs::remove_file(start_file(path)) {
        Err(error) if error.kind() != ErrorKind::NotFound => Err(error),
        _ => Ok(()),
    }
}

/// One of a stream's files, and where in the stream it begins.
struct Segment {
    start: u64,
    file: File,
    length: u64,
}

/// A stream's files, oldest first; and whether the current file is also
/// `path.1` (a rotation half done).
fn segments(path: &Path) -> std::io::Result<Option<(Vec<Segment>, bool)>> {
    use std::os::unix::fs::MetadataExt;
    let current = match File::open(path) {
        Ok(file) => file,
        Err(error) if error.kind() == ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let start = read_start(path);
    let metadata = current.metadata()?;
    let mut segments = vec![Segment { start, file: current, length: metadata.len() }];
    let mut begins = start;
    let mut halfway = false;
    for index in 1..=MOST_ROTATED {
        let Ok(file) = File::open(rotated(path, index)) else { break };
        let rotated = file.metadata()?;
        halfway |= index == 1 && (rotated.dev(), rotated.ino()) == (metadata.dev(), metadata.ino());
        begins = begins.saturating_sub(rotated.len());
        segments.push(Segment { start: begins, file, length: rotated.len() });
    }
    segments.reverse();
    Ok(Some((segments, halfway)))
}

/// At most `most` bytes of the stream at `path`: from `offset` on (from
/// its oldest kept byte when rotation took the bytes before, and from its
/// start when the stream is shorter: it was started again), or its last
/// ones. Returns where they begin in the stream, and them; None when the
/// stream has no file.
pub fn read_window(path: &Path, offset: Option<u64>, most: u64) -> std::io::Result<Option<(u64, Vec<u8>)>> {
    // A rotation between the look at the files and the read of the start
    // would misplace them: looked at again then.
    let mut found = None;
    for _ in 0..100 {
        let before = read_start(path);
        found = segments(path)?;
        let halfway = found.as_ref().is_some_and(|(_, halfway)| *halfway);
        if !halfway && read_start(path) == before {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    let Some((mut segments, _)) = found else { return Ok(None) };
    let first = segments.first().map_or(0, |s| s.start);
    let end = segments.last().map_or(0, |s| s.start + s.length);
    let (from, to) = herd_core::api::log_window(first, end, offset, most);
    let mut bytes = Vec::with_capacity(usize::try_from(to - from).unwrap_or(0));
    for segment in &mut segments {
        let (lo, hi) = (from.max(segment.start), to.min(segment.start + segment.length));
        if lo >= hi {
            continue;
        }
        segment.file.seek(SeekFrom::Start(lo - segment.start))?;
        (&mut segment.file).take(hi - lo).read_to_end(&mut bytes)?;
    }
    Ok(Some((from, bytes)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::quantity::Bytes;

    fn rotation(max: u64, keep: u32) -> LogRotation {
        LogRotation { max_size: Bytes(max), keep }
    }

    fn on_disk(dir: &Path) -> u64 {
        std::fs::read_dir(dir).unwrap().flatten().map(|e| e.metadata().unwrap().len()).sum()
    }

    #[test]
    fn a_stream_stays_within_its_budget_and_reads_on_across_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stdout.log");
        let stream: Vec<u8> = (0..10_000u32).flat_map(|i| format!("line {i}\n").into_bytes()).collect();
        write_rotated(&path, &rotation(10_000, 2), &stream[..]).unwrap();
        assert!(on_disk(dir.path()) <= 30_000 + 64, "{} bytes kept", on_disk(dir.path()));
        assert!(rotated(&path, 2).exists() && !rotated(&path, 3).exists());

        let (start, tail) = read_window(&path, None, 25_000).unwrap().unwrap();
        assert_eq!(start, stream.len() as u64 - 25_000);
        assert_eq!(tail, &stream[start as usize..], "the last bytes, read across three files");
        let (first, all) = read_window(&path, Some(0), u64::MAX).unwrap().unwrap();
        assert!(first > 0, "what rotation took is gone");
        assert_eq!(all, &stream[first as usize..]);

        // A follower from where it was: the rest, through a later rotation.
        let end = stream.len() as u64;
        write_rotated(&path, &rotation(10_000, 2), &b"more and more\n".repeat(1000)[..]).unwrap();
        let (from, more) = read_window(&path, Some(end), u64::MAX).unwrap().unwrap();
        assert_eq!((from, more), (end, b"more and more\n".repeat(1000)));
        assert_eq!(read_window(&dir.path().join("none.log"), None, 10).unwrap(), None);

        // Started over: no rotated file is left, and the stream begins at 0.
        forget_rotated(&path).unwrap();
        std::fs::write(&path, b"afresh\n").unwrap();
        assert_eq!(read_window(&path, Some(0), u64::MAX).unwrap().unwrap(), (0, b"afresh\n".to_vec()));
        assert_eq!(on_disk(dir.path()), 7);
    }

    #[test]
    fn keeping_none_keeps_the_current_file_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stderr.log");
        write_rotated(&path, &rotation(4096, 0), &vec![b'x'; 100_000][..]).unwrap();
        assert!(on_disk(dir.path()) <= 4096 + 64);
        assert!(!rotated(&path, 1).exists());
    }
}
