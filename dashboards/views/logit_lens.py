"""logit_lens page: being built."""
import streamlit as st

st.header("logit_lens")
st.info("This page is being built.")
