use datum_guest::map;

#[map]
struct Mask {
    column: String,
}

fn main() {}
