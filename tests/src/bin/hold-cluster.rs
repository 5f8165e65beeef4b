//! Starts a throwaway cluster, prints `ROOT_DIR POSTMASTER_PID` on one line
//! and waits to be killed: the interruption tests kill it from outside.

fn main() {
    let pg = datum_tests::cluster();
    println!(
        "{} {}",
        pg.root_dir().display(),
        pg.pid().expect("a started cluster has a pid")
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(60));
    }
}
