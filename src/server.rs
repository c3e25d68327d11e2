//! (in progress) `fjord serve`.

pub fn run(_args: crate::config::ServeArgs) -> anyhow::Result<()> {
    anyhow::bail!("serve is not implemented yet")
}
