//! redis-py (the pinned version in requirements.txt) against the RESP front
//! end: RESP2 and RESP3, AUTH, CL.THROTTLE, INCR/EXPIRE in a pipeline and
//! in MULTI/EXEC (a MULTI past its bytes refused with OutOfMemoryError),
//! GET/TTL/PTTL/DEL, refused scripts, and RedisCluster
//! routing by CLUSTER SLOTS. The script (resp_client.py) asserts every
//! reply; this test runs it and fails with its output.

use super::common::TestServer;
use super::{python, run, stdout_of};

#[tokio::test]
async fn redis_py_drives_every_command() {
    let token = "py-token-0123456789abcdef";
    let server = TestServer::start_resp(|c| c.auth.auth_token = Some(token.into())).await;
    let resp = server.resp.unwrap();
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/frontends/resp_client.py"
    );
    let args = [script.to_owned(), resp.port().to_string(), token.to_owned()];
    let out = run(python().to_str().unwrap(), &args).await;
    assert_eq!(stdout_of(&out, "resp_client.py").trim(), "ok");
    server.stop().await;
}
