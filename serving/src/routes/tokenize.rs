//! `POST /tokenize` (a prompt, or messages through the chat template) and
//! `POST /detokenize`, in vLLM's schemas.

use axum::Json;
use axum::extract::State;

use crate::error::{Error, Result};
use crate::json::JsonBody;
use crate::protocol::tokenize::{DetokenizeRequest, DetokenizeResponse, TokenizeRequest, TokenizeResponse};
use crate::routes::chat::messages;
use crate::state::AppState;
use crate::tools::tool_list;
use crate::validate;

/// `POST /tokenize`.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>> {
    state.check_model(request.model.as_deref())?;
    let model = &state.model;
    let tokens = match (&request.prompt, &request.messages) {
        (Some(prompt), None) => model.encode(prompt, request.add_special_tokens.unwrap_or(true))?,
        (None, Some(chat)) => {
            let tools = tool_list(request.tools.as_ref())?;
            let text = model.render_chat(
                &messages(chat)?,
                &tools,
                request.add_generation_prompt,
                request.continue_final_message,
                &request.chat_template_kwargs.clone().unwrap_or_default(),
            )?;
            model.encode(&text, request.add_special_tokens.unwrap_or(false))?
        }
        _ => {
            return Err(Error::invalid("prompt", "give either `prompt` or `messages`"));
        }
    };
    let token_strs = request.return_token_strs.then(|| {
        let spell = |&id: &u32| model.tokenizer.id_to_token(id).unwrap_or_default();
        tokens.iter().map(spell).collect()
    });
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: model.max_model_len,
        tokens,
        token_strs,
    }))
}

/// `POST /detokenize`.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>> {
    state.check_model(request.model.as_deref())?;
    let ids = validate::token_ids("tokens", &request.tokens)?;
    let vocab = state.model.tokenizer.vocab_size();
    if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
        return Err(Error::invalid(
            "tokens",
            format!("token {bad} is outside the vocabulary of {vocab}"),
        ));
    }
    Ok(Json(DetokenizeResponse {
        prompt: state.model.decode(&ids)?,
    }))
}
