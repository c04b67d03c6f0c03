//! A connection is bounded in time whatever its request's body does.
//!
//! actix-http closes a connection after the answer to a request whose body
//! has not fully arrived — unless the body is chunked and the application
//! has let go of it: then it goes on reading ("draining") the rest of the
//! body for as long as the client keeps it open, with no deadline, and
//! parses whatever comes after it as the next request, even after an answer
//! that said `connection: close`. A client without a token could hold any
//! number of connections that way.
//!
//! [`close_after_unfinished_body`], the outermost middleware, holds on to
//! the request's body until its answer is written, so that actix-http sees a
//! body still wanted and unfinished, whatever its framing: it answers with
//! `connection: close`, reads what the client still sends for at most
//! [`LINGER`] without parsing it, and closes. A body that has fully arrived
//! leaves the connection as it was (keep-alive).

use std::cell::RefCell;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll};
use std::time::Duration;

use actix_web::HttpMessage;
use actix_web::body::{BodySize, BoxBody, EitherBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::error::PayloadError;
use actix_web::middleware::Next;
use actix_web::web::Bytes;
use futures_util::Stream;

/// How long a connection answered before its body arrived reads (and
/// throws away) what the client still sends before it is closed: the
/// client has time to read the answer instead of a reset.
pub const LINGER: Duration = Duration::from_secs(1);

/// The request's body, shared by the handler (which reads it) and the
/// answer (which keeps it until it is written).
type Shared = Rc<RefCell<Payload>>;

/// Middleware: the request's body stays held until its answer has been
/// written (see the module's documentation). A request without a body
/// passes as it is.
pub async fn close_after_unfinished_body<B: MessageBody + 'static>(
    mut req: ServiceRequest,
    next: Next<B>,
) -> Result<ServiceResponse<EitherBody<B, HeldBody>>, actix_web::Error> {
    let payload = req.take_payload();
    if matches!(payload, Payload::None) {
        return Ok(next.call(req).await?.map_into_left_body());
    }
    let shared: Shared = Rc::new(RefCell::new(payload));
    req.set_payload(Payload::from(Box::pin(Reader(Rc::clone(&shared)))
        as Pin<Box<dyn Stream<Item = Result<Bytes, PayloadError>>>>));
    let res = next.call(req).await?;
    Ok(res
        .map_body(|_, body| HeldBody {
            body: body.boxed(),
            _payload: shared,
        })
        .map_into_right_body())
}

/// The handler's view of the shared body.
struct Reader(Shared);

impl Stream for Reader {
    type Item = Result<Bytes, PayloadError>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        // Only this reader borrows it, and never across a poll.
        match self.0.try_borrow_mut() {
            Ok(mut payload) => Pin::new(&mut *payload).poll_next(cx),
            Err(_) => Poll::Ready(Some(Err(PayloadError::Incomplete(None)))),
        }
    }
}

/// An answer's body that keeps its request's body until it is dropped,
/// after actix-http has written the answer and decided about the
/// connection.
pub struct HeldBody {
    body: BoxBody,
    _payload: Shared,
}

impl MessageBody for HeldBody {
    type Error = Box<dyn std::error::Error>;

    fn size(&self) -> BodySize {
        self.body.size()
    }

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Bytes, Self::Error>>> {
        Pin::new(&mut self.body).poll_next(cx)
    }
}
