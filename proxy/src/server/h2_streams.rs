//! The executor the h2 server spawns each stream's task on. It gives the stream a
//! [`StreamWatch`] (through a task-local, so the response body made inside can report to
//! it) and ends the stream when hyper has held a frame for longer than `timeouts.write`
//! without send capacity: the caller stopped reading (a zero flow-control window). Dropping
//! the task drops the stream's handles, and h2 resets the stream (`RST_STREAM CANCEL`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::futures::TaskLocalFuture;
use tokio::time::{Instant, Sleep};

use crate::body::{StreamWatch, STREAM_WATCH};

#[derive(Debug, Clone)]
pub struct StreamExecutor {
    pub write: Duration,
}

impl<F> hyper::rt::Executor<F> for StreamExecutor
where
    F: Future<Output = ()> + Send + 'static,
{
    fn execute(&self, stream: F) {
        let watch = Arc::new(StreamWatch::default());
        tokio::spawn(Guarded {
            stream: Box::pin(STREAM_WATCH.scope(watch.clone(), stream)),
            watch,
            write: self.write,
            timer: None,
        });
    }
}

struct Guarded<F: 'static> {
    stream: Pin<Box<TaskLocalFuture<Arc<StreamWatch>, F>>>,
    watch: Arc<StreamWatch>,
    write: Duration,
    timer: Option<Pin<Box<Sleep>>>,
}

impl<F: Future<Output = ()>> Future for Guarded<F> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.stream.as_mut().poll(cx).is_ready() {
            return Poll::Ready(());
        }
        let Some(since) = self.watch.waiting_on_caller_since() else {
            return Poll::Pending;
        };
        let give_up_at = since + self.write;
        if Instant::now() >= give_up_at {
            tracing::debug!("h2 stream reset: the caller read nothing for timeouts.write");
            return Poll::Ready(());
        }
        let timer = match self.timer.as_mut() {
            Some(timer) => {
                if timer.deadline() != give_up_at {
                    timer.as_mut().reset(give_up_at);
                }
                timer
            }
            None => self.timer.insert(Box::pin(tokio::time::sleep_until(give_up_at))),
        };
        if timer.as_mut().poll(cx).is_ready() {
            // Woken by the timer: look again on the next poll.
            cx.waker().wake_by_ref();
        }
        Poll::Pending
    }
}
