//! The bus status without joining it, for `agent-relay status` and
//! `doctor`: one `status` request on a fresh connection to the leader.

use std::time::Duration;

use super::handle::MemberError;
use crate::bus::election::BusDir;
use crate::bus::wire::{self, Received};
use crate::config::BotId;
use crate::paths::Paths;
use crate::protocol::bus::*;

/// How long the leader has to answer.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// What `doctor` learns about the leader: what the socket answers, and
/// which pid `leader.json` names (for people only: it decides nothing).
pub struct LeaderReport {
    pub status: Result<Option<BusStatus>, MemberError>,
    pub recorded_pid: Option<u32>,
}

pub async fn leader_report(paths: &Paths, bot: BotId) -> LeaderReport {
    LeaderReport {
        recorded_pid: BusDir::new(paths.bus_dir(bot)).leader_info().map(|i| i.pid),
        status: query_status(paths, bot).await,
    }
}

/// Asks the running leader for the bus status. `Ok(None)` when no leader
/// is running.
pub async fn query_status(paths: &Paths, bot: BotId) -> Result<Option<BusStatus>, MemberError> {
    let bus = BusDir::new(paths.bus_dir(bot));
    let stream = match bus.connect().await {
        Ok(stream) => stream,
        Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
            return Err(MemberError::Refused(BusError::new(
                BusErrorCode::Forbidden,
                format!("not asking {}: {e}", bus.socket_path().display()),
            )));
        }
        // No socket, or nobody listening: no leader runs.
        Err(_) => return Ok(None),
    };
    let (mut reader, mut writer) = wire::split(stream);
    writer
        .send(&ToLeader::Status(StatusQuery {
            id: 1,
            cluster: true,
        }))
        .await
        .map_err(|_| MemberError::NotConnected)?;
    let ack = tokio::time::timeout(ANSWER_TIMEOUT, async {
        loop {
            match reader.recv::<FromLeader>().await {
                Ok(Some(Received::Envelope(FromLeader::Ack(ack)))) if ack.id == Some(1) => {
                    return Ok(ack);
                }
                Ok(Some(_)) => continue,
                _ => return Err(MemberError::NotConnected),
            }
        }
    })
    .await
    .map_err(|_| MemberError::Timeout(ANSWER_TIMEOUT))??;
    ack.reply::<StatusQuery>()
        .map(Some)
        .map_err(MemberError::Refused)
}
