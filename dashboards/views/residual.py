"""residual page: being built."""
import streamlit as st

st.header("residual")
st.info("This page is being built.")
