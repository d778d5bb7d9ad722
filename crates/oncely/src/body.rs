//! A request body with a deadline: a client that sends its body too slowly — a byte now and
//! then, never enough to trip a timeout between reads — is cut off when the whole body has not
//! arrived by the deadline, and answered 408 (the problem type `request-body-timeout`) instead of holding its connection and a worker's attention.

use std::future::Future as _;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::time::{Instant, Sleep};

/// The error a [`Deadline`] body ends with once its deadline passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body did not arrive within {0:?}")]
pub struct BodyTimedOut(pub Duration);

/// `body`, ended with [`BodyTimedOut`] if it has not been read to its end within `within` of
/// its first read (not of the request's arrival: a handler that waits before reading — a busy
/// pool — does not use up the client's time, and an `Expect: 100-continue` client sends nothing
/// until then). The whole body counts, not the time between two reads.
pub struct Deadline<B> {
    body: B,
    within: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    done: bool,
}

impl<B> Deadline<B> {
    /// `body`, due in full within `within` of its first read.
    pub fn new(body: B, within: Duration) -> Self {
        Self {
            body,
            within,
            sleep: None,
            done: false,
        }
    }
}

impl<B> Body for Deadline<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<axum::BoxError>,
{
    type Data = Bytes;
    type Error = axum::BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        let within = this.within;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + within)));
        match Pin::new(&mut this.body).poll_frame(cx) {
            Poll::Ready(frame) => Poll::Ready(frame.map(|f| f.map_err(Into::into))),
            Poll::Pending => match sleep.as_mut().poll(cx) {
                Poll::Ready(()) => {
                    this.done = true;
                    Poll::Ready(Some(Err(Box::new(BodyTimedOut(within)))))
                }
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    /// `left` one-byte frames, one every `every`.
    struct Trickle {
        left: u32,
        every: Duration,
        sleep: Pin<Box<Sleep>>,
    }

    impl Body for Trickle {
        type Data = Bytes;
        type Error = std::io::Error;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            if self.left == 0 {
                return Poll::Ready(None);
            }
            match self.sleep.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(()) => {
                    let every = self.every;
                    self.sleep.as_mut().reset(Instant::now() + every);
                    self.left -= 1;
                    Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(b"x")))))
                }
            }
        }
    }

    fn trickle(left: u32, every: Duration) -> Trickle {
        Trickle {
            left,
            every,
            sleep: Box::pin(tokio::time::sleep(every)),
        }
    }

    #[tokio::test]
    async fn a_body_that_arrives_in_time_is_read_whole_and_a_trickle_is_cut_off() {
        let read = Deadline::new(
            trickle(3, Duration::from_millis(10)),
            Duration::from_secs(1),
        )
        .collect()
        .await;
        assert_eq!(read.unwrap().to_bytes(), Bytes::from_static(b"xxx"));

        // One byte every 100 ms: no gap is long, but the whole takes 3 s.
        let body = Deadline::new(
            trickle(30, Duration::from_millis(100)),
            Duration::from_millis(500),
        );
        let error = body.collect().await.unwrap_err();
        assert!(error.is::<BodyTimedOut>(), "{error}");

        // The time counts from the first read, not from the request's arrival: a handler that
        // waited (a busy pool) does not use up the client's time.
        let late = Deadline::new(
            trickle(3, Duration::from_millis(10)),
            Duration::from_millis(200),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        let read = late.collect().await;
        assert_eq!(read.unwrap().to_bytes(), Bytes::from_static(b"xxx"));
    }
}
