//! libpq's password file (`~/.pgpass`, `PGPASSFILE`, `passfile=`): lines
//! `hostname:port:database:username:password`, each of the first four
//! fields a value or `*` (anything), `\:` and `\\` escaping a colon and a
//! backslash; the first line that matches gives the password. A file that
//! its group or others may read is ignored, as libpq ignores it, and the
//! reason is kept for the error a refused login then reports.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// libpq's socket directories that `localhost` in the file stands for.
const DEFAULT_SOCKET_DIRS: &[&str] = &["/var/run/postgresql", "/run/postgresql"];

/// What the password file said for one connection.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Found {
    /// The password of the first matching line.
    pub(super) password: Option<String>,
    /// Why the file was not read (shown when the login then fails).
    pub(super) ignored: Option<String>,
}

/// The password file: `given` (the connection string's `passfile`), else
/// `PGPASSFILE`, else `~/.pgpass`; None without a home directory.
pub(super) fn path(given: Option<&str>) -> Option<PathBuf> {
    if let Some(file) = given.filter(|f| !f.is_empty()) {
        return Some(PathBuf::from(file));
    }
    match std::env::var_os("PGPASSFILE") {
        Some(file) if !file.is_empty() => Some(PathBuf::from(file)),
        _ => std::env::home_dir().map(|home| home.join(".pgpass")),
    }
}

/// The password `file` holds for `host` (a name, an address or a socket
/// directory), `port`, `database` and `user`.
pub(super) fn lookup(file: &Path, host: &str, port: u16, database: &str, user: &str) -> Found {
    let Ok(meta) = std::fs::metadata(file) else {
        return Found::default();
    };
    let shown = file.display();
    if !meta.file_type().is_file() {
        return ignored(format!("password file {shown} is not a plain file"));
    }
    if meta.mode() & 0o077 != 0 {
        return ignored(format!(
            "password file {shown} was ignored: it has group or world access ({:04o}); \
             permissions should be u=rw (0600) or less (chmod 600 it)",
            meta.mode() & 0o777
        ));
    }
    let text = match std::fs::read_to_string(file) {
        Ok(text) => text,
        Err(e) => return ignored(format!("password file {shown} cannot be read ({e})")),
    };
    let host = if DEFAULT_SOCKET_DIRS.contains(&host) || host.is_empty() {
        "localhost"
    } else {
        host
    };
    let port = port.to_string();
    let want = [host, port.as_str(), database, user];
    let password = text
        .lines()
        .map(|l| l.trim_end_matches('\r'))
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find_map(|line| matching(line, &want));
    Found {
        password,
        ignored: None,
    }
}

fn ignored(why: String) -> Found {
    Found {
        password: None,
        ignored: Some(why),
    }
}

/// The password of `line` when its first four fields match `want`.
fn matching(line: &str, want: &[&str; 4]) -> Option<String> {
    let mut rest = line;
    for token in want {
        let (field, after) = field(rest)?;
        if field.raw != "*" && field.value != *token {
            return None;
        }
        rest = after?;
    }
    Some(field(rest)?.0.value)
}

/// A field as written and unescaped.
struct Field<'a> {
    raw: &'a str,
    value: String,
}

/// The first field of `s` (up to an unescaped colon) and what follows
/// that colon (None when the line ends).
fn field(s: &str) -> Option<(Field<'_>, Option<&str>)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => {
                if let Some((_, next)) = chars.next() {
                    value.push(next);
                }
            }
            ':' => {
                let raw = s.get(..i)?;
                return Some((Field { raw, value }, s.get(i + 1..)));
            }
            c => value.push(c),
        }
    }
    Some((Field { raw: s, value }, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pgpass");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn the_first_matching_line_gives_the_password() {
        let (_d, f) = file(
            "# a comment\n\
             other:5432:reg:mccloud:not-this\n\
             db.example.net:5432:reg:mccloud:p\\:a\\\\ss:word\n\
             *:*:*:mccloud:fallback\n\
             d\\:b:*:*:*:escaped-host\n",
            0o600,
        );
        let pw = |h: &str, p: u16, d: &str, u: &str| lookup(&f, h, p, d, u).password;
        assert_eq!(
            pw("db.example.net", 5432, "reg", "mccloud").as_deref(),
            Some("p:a\\ss")
        );
        assert_eq!(
            pw("db.example.net", 5433, "reg", "mccloud").as_deref(),
            Some("fallback")
        );
        assert_eq!(pw("d:b", 1, "x", "y").as_deref(), Some("escaped-host"));
        assert_eq!(pw("db.example.net", 5432, "reg", "someone"), None);
        // the default socket directory is localhost; another is itself
        let (_d, f) = file("localhost:5432:*:*:local\n/tmp/s:5432:*:*:sock\n", 0o600);
        assert_eq!(
            lookup(&f, "/var/run/postgresql", 5432, "d", "u")
                .password
                .as_deref(),
            Some("local")
        );
        assert_eq!(
            lookup(&f, "/tmp/s", 5432, "d", "u").password.as_deref(),
            Some("sock")
        );
    }

    #[test]
    fn a_file_others_may_read_is_ignored_and_says_so() {
        let (_d, f) = file("*:*:*:*:secret\n", 0o644);
        let found = lookup(&f, "h", 5432, "d", "u");
        assert_eq!(found.password, None);
        let why = found.ignored.unwrap();
        assert!(
            why.contains("group or world access") && why.contains("0644"),
            "{why}"
        );
        assert!(!why.contains("secret"), "{why}");
        assert_eq!(
            lookup(Path::new("/nonexistent/pgpass"), "h", 5432, "d", "u"),
            Found::default()
        );
    }
}
