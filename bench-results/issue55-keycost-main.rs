//! The key's cost before (vDSO draw, as the crate drew it with
//! `vdso-keys`) and after (uuid's `new_v4`, one getrandom system call),
//! alternated in one run: 11 rounds of 200 000 draws each, medians.
use std::time::Instant;
use vdso_rng::{LocalState, Pool};

fn main() {
    let pool = Pool::new().expect("vDSO getrandom");
    let mut state = LocalState::new(&pool).unwrap();
    let n = 200_000u32;
    let (mut before, mut after) = (Vec::new(), Vec::new());
    let mut sink = 0u8;
    for _ in 0..11 {
        let t = Instant::now();
        for _ in 0..n {
            let mut buf = [0u8; 16];
            state.fill(&mut buf, 0).unwrap();
            sink ^= buf[3];
        }
        before.push(t.elapsed().as_nanos() as f64 / f64::from(n));
        let t = Instant::now();
        for _ in 0..n {
            let buf = uuid::Uuid::new_v4().into_bytes();
            sink ^= buf[3];
        }
        after.push(t.elapsed().as_nanos() as f64 / f64::from(n));
    }
    before.sort_by(f64::total_cmp);
    after.sort_by(f64::total_cmp);
    println!("vdso draw   ns/key: median {:.1} (min {:.1}, max {:.1})", before[5], before[0], before[10]);
    println!("getrandom   ns/key: median {:.1} (min {:.1}, max {:.1})", after[5], after[0], after[10]);
    println!("ratio after/before: {:.2} (sink {sink})", after[5] / before[5]);
}
