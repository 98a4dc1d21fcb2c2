//! The commit the binary is built from, for `dedupe --version` and `dedupe_build_info`:
//! `DEDUPE_COMMIT` when it is set (the image's build, which copies no `.git`), else git's `HEAD`
//! of the checkout, else `unknown`.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=DEDUPE_COMMIT");
    let commit = std::env::var("DEDUPE_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .or_else(git_head)
        .unwrap_or_else(|| "unknown".to_string());
    println!("cargo:rustc-env=DEDUPE_COMMIT={}", commit.trim());
}

/// `HEAD`'s commit, 12 digits; asks to run again when `HEAD` or the branch it names moves.
fn git_head() -> Option<String> {
    let git = |args: &[&str]| {
        let out = Command::new("git").args(args).output().ok()?;
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
    };
    let head = git(&["rev-parse", "--short=12", "HEAD"])?;
    // A worktree has a HEAD of its own; its branches are in the common directory.
    let dir = git(&["rev-parse", "--absolute-git-dir"])?;
    let common = git(&["rev-parse", "--path-format=absolute", "--git-common-dir"])?;
    let mut watched = vec![Path::new(&dir).join("HEAD")];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.push(Path::new(&common).join(branch));
    }
    watched.push(Path::new(&common).join("packed-refs"));
    // A path that does not exist would run this again on every build.
    for path in watched.iter().filter(|p| p.exists()) {
        println!("cargo:rerun-if-changed={}", path.display());
    }
    Some(head)
}
