//! The Messages door's translations, request and answer, whole and streamed.

mod messages_answer;
mod messages_request;
mod messages_stream;
mod props;
mod responses;
