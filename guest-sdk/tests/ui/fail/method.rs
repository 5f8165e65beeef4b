use datum_guest::{Change, Result, filter};

struct Rules;

impl Rules {
    #[filter]
    fn keep(&self) -> Result<bool> {
        Ok(true)
    }
}

fn main() {
    let _ = Change::insert("s", "t");
    let _ = Rules;
}
