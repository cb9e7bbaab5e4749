// The migrations are embedded at compile time (refinery's embed_migrations!), which cargo
// cannot see: rebuild when a file in migrations/ is added or changed.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
